"""A run name resumes only its own work, against the session's Prefect server: another flow run
may take it over only from an owner that ended without completing, on the same data and
parameters; each owner state tried."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from prefect import flow, get_client
from prefect.client.schemas.objects import State
from prefect.states import Cancelled, Completed, Crashed, Failed, Pending, Running, Scheduled

from flows.run_ownership import RunNameTakenError, claim_run_name, fingerprint
from flows.run_policy import RunPolicy
from tasks.layout import StorageLayout

WORKER_POLICY = RunPolicy(source="run-policy.toml")  # a worker that runs others' runs
SAME = fingerprint("data-digest", {"epochs": 1, "lr": 0.1})
OTHER = fingerprint("data-digest", {"epochs": 1, "lr": 0.2})


@flow
def _owner() -> None:
    """Never run: the flow the owners' flow runs are made of."""


def _flow_run(state: State | None = None) -> str:
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(_owner)
        if state is not None:
            client.set_flow_run_state(run.id, state, force=True)
    return str(run.id)


def _claim(
    layout: StorageLayout, monkeypatch: pytest.MonkeyPatch, flow_run_id: str, print_: str
) -> None:
    with monkeypatch.context() as patch:
        patch.setenv("PREFECT__FLOW_RUN_ID", flow_run_id)  # as inside that flow run
        claim_run_name(layout, "nightly-retry", print_, WORKER_POLICY)


@pytest.mark.parametrize(
    ("state", "taken_over"),
    [
        (Failed, True),
        (Crashed, True),
        (Cancelled, True),
        (Completed, False),
        (Running, False),
        (Pending, False),
        (Scheduled, False),
    ],
)
def test_run_name_another_flow_run_resumes_only_an_owner_that_did_not_complete(
    prefect_server: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    state: Callable[[], State],
    taken_over: bool,
) -> None:
    layout = StorageLayout.at(str(tmp_path))
    owner = _flow_run()
    _claim(layout, monkeypatch, owner, SAME)
    _claim(layout, monkeypatch, owner, SAME)  # the owner's own retry
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(owner, state(), force=True)  # type: ignore[arg-type]
    other = _flow_run()
    why = "other data or with other parameters" if taken_over else "only a run that ended"
    with pytest.raises(RunNameTakenError, match=f"belongs to flow run {owner}.*{why}"):
        _claim(layout, monkeypatch, other, OTHER)  # never: another training in its run
    if taken_over:
        _claim(layout, monkeypatch, other, SAME)
        with pytest.raises(RunNameTakenError, match=f"belongs to flow run {other}"):
            _claim(layout, monkeypatch, _flow_run(Running()), SAME)  # the new owner is live
    else:
        with pytest.raises(RunNameTakenError, match=f"belongs to flow run {owner} \\("):
            _claim(layout, monkeypatch, other, SAME)


def test_run_name_on_a_users_own_command_line_every_run_is_the_users(
    prefect_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a policy file: a run whose driver was killed stays Running in Prefect's local
    database, and naming it again resumes it."""
    layout = StorageLayout.at(str(tmp_path))
    with monkeypatch.context() as patch:
        patch.setenv("PREFECT__FLOW_RUN_ID", _flow_run(Running()))
        claim_run_name(layout, "mine", SAME, RunPolicy())
        second = _flow_run(Running())
        patch.setenv("PREFECT__FLOW_RUN_ID", second)
        claim_run_name(layout, "mine", SAME, RunPolicy())
    owner = json.loads((tmp_path / "owners" / "mine.json").read_text())
    assert owner == {"flow_run_id": second, "fingerprint": SAME}
