"""The sweep-storage flow (its own daily deployment) against the session's Prefect server: the
runs that ended lose what no checkpoint commit made, and whole runs past the retention; a
running one and a user's own run name are left alone; a retention it cannot read fails the run
with the variable named (and so alerts, as any deployment's failed run)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Running

from flows.sweep_storage import sweep_storage
from tests.tasks.test_retention import _contents, _run

pytestmark = pytest.mark.usefixtures("prefect_server")


@flow(name="sweep-test-run")
def _a_run() -> None:
    """A flow run that ends at once (its id names a run directory)."""


def _running() -> str:
    with get_client(sync_client=True) as client:
        return str(client.create_flow_run(_a_run, state=Running()).id)


def _age(run: Path, days: float) -> None:
    """Every file and folder of ``run`` last written ``days`` ago."""
    then = time.time() - days * 86400
    for path in [run, *run.rglob("*")]:
        os.utime(path, (then, then))


def test_sweep_storage_removes_what_ended_runs_left_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CIFAR_RETENTION_DAYS", "2")
    runs = tmp_path / "runs"
    ended = [str(_a_run(return_state=True).state_details.flow_run_id) for _ in range(2)]
    recent, old = (_run(runs, f"train-cifar-{i}") for i in ended)
    _age(old, 3)
    running = _run(runs, f"train-cifar-{_running()}")
    users = _run(runs, "my-experiment")
    _age(users, 3)
    assert sweep_storage(storage_path=str(tmp_path)) == {"uncommitted": 1, "expired": 1}
    assert _contents(recent) == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert not old.exists()
    assert "checkpoint_000003" in _contents(running) and "checkpoint_000003" in _contents(users)


def test_sweep_storage_with_an_unreadable_retention_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CIFAR_RETENTION_DAYS", "ninety")
    _run(tmp_path / "runs", f"train-cifar-{uuid.uuid4()}")
    state = sweep_storage(storage_path=str(tmp_path), return_state=True)
    assert state.is_failed()
    assert "CIFAR_RETENTION_DAYS='ninety' must be a positive number of days" in str(state.message)
