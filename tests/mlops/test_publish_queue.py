"""One publication at a time per model, in version order, on a real MLflow store: a version
waits for every earlier unsettled one, an earlier one whose flow run ended unsettled is
withdrawn (never one that settled as its run ended), a run Prefect cannot answer for is waited
for, and two publishers started together take distinct places in the model's ledger."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from mlops import ledger
from mlops.alias_moves import promote
from mlops.publish_queue import QueueTimeout, wait_for_turn
from mlops.version_tags import PROMOTION_TAG, REQUEST_TAG, WITHDRAWN_TAG
from tests.mlops.test_promotion import _correct, _evaluation, _register, _rule, _score


def _versions(tracking_uri: str, name: str, requests: list[str | None]) -> list[str]:
    """Versions of ``name`` registered by the flow runs ``requests`` (None: by hand)."""
    client = MlflowClient(tracking_uri)
    client.create_registered_model(name)
    made = []
    for request in requests:
        tags = {} if request is None else {REQUEST_TAG: request}
        made.append(str(client.create_model_version(name, "file:///nowhere", tags=tags).version))
    return made


def _settle(tracking_uri: str, name: str, version: str) -> None:
    MlflowClient(tracking_uri).set_model_version_tag(name, version, PROMOTION_TAG, "decided")


def _tags(tracking_uri: str, name: str, version: str) -> dict[str, str]:
    return dict(MlflowClient(tracking_uri).get_model_version(name, version).tags)


def _waiting(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            target()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_version_waits_for_every_earlier_unsettled_one_and_goes_once_they_settle(
    tracking_uri: str,
) -> None:
    name = "queued"
    v1, v2, v3, _ = _versions(tracking_uri, name, ["run-1", "run-2", "run-3", "run-4"])
    _settle(tracking_uri, name, v1)
    live = {"run-2", "run-3", "run-4"}
    polled = threading.Event()

    def poll() -> None:
        polled.set()
        time.sleep(0.01)

    thread, outcome = _waiting(
        lambda: wait_for_turn(name, v3, tracking_uri, "run-3", lambda r: r in live, 60, poll)
    )
    assert polled.wait(60), "the wait never looked at the registry"
    assert thread.is_alive() and outcome == []  # version 2 is going: version 3 waits
    _settle(tracking_uri, name, v2)  # version 4 (later, unsettled) holds nothing up
    thread.join(60)
    assert outcome == [None]
    assert WITHDRAWN_TAG not in _tags(tracking_uri, name, v2)


def test_an_earlier_version_of_an_ended_run_is_withdrawn_one_prefect_cannot_answer_for_waited(
    tracking_uri: str,
) -> None:
    name = "stuck"
    killed, by_hand, unknown, own, mine = _versions(
        tracking_uri, name, ["run-killed", None, "run-unknown", "run-me", "run-me"]
    )

    def in_progress(run: str) -> bool:
        if run == "run-unknown":
            raise ConnectionError("Prefect server unreachable")
        return False

    with pytest.raises(QueueTimeout) as raised:
        wait_for_turn(name, mine, tracking_uri, "run-me", in_progress, 0.2, lambda: None)
    assert str(raised.value) == (
        f"version {mine} of 'stuck' waited 0 s for earlier versions to finish publishing: "
        f"version {unknown} (flow run run-unknown). Let those flow runs finish or cancel them (a "
        "cancelled run's version is withdrawn at the next publish), then run this flow again."
    )
    for version, run in ((killed, "run-killed"), (by_hand, "unknown")):
        assert _tags(tracking_uri, name, version)[WITHDRAWN_TAG] == (
            f"left by a publish that never finished (flow run {run})"
        )
    for version in (unknown, own):  # waited for; this run's own never holds it up
        assert WITHDRAWN_TAG not in _tags(tracking_uri, name, version)


def test_a_version_that_settles_as_its_run_ends_is_not_withdrawn(tracking_uri: str) -> None:
    """The registry read says unsettled; by the time Prefect says the run ended, it settled."""
    name = "just-in-time"
    earlier, mine = _versions(tracking_uri, name, ["run-a", "run-b"])

    def ends_having_settled(run: str) -> bool:
        _settle(tracking_uri, name, earlier)
        return False

    wait_for_turn(name, mine, tracking_uri, "run-b", ends_having_settled, 5, lambda: None)
    assert WITHDRAWN_TAG not in _tags(tracking_uri, name, earlier)


def test_two_publishers_started_together_take_distinct_places_in_the_ledger(
    tracking_uri: str,
) -> None:
    """Both registered, both judged against the same champion at once: one waits for the
    other, so neither spends the other's share of the model's alpha."""
    name = "two-at-once"
    champion = _register(tracking_uri, name)
    promote(name, champion, _evaluation(_correct(700)), _rule(), tracking_uri)
    client = MlflowClient(tracking_uri)
    for _ in range(5):  # five rounds of two: each round's pair starts together
        pair = [_register(tracking_uri, name) for _ in range(2)]
        for version in pair:  # each version's "flow run" is named after it
            client.set_model_version_tag(name, version, REQUEST_TAG, version)
        start, live = threading.Barrier(2), set(pair)
        threads = [
            _waiting(functools.partial(_publish, tracking_uri, name, v, champion, start, live))
            for v in pair
        ]
        for thread, outcome in threads:
            thread.join(120)
            assert outcome == [None]
    places = [e.k for e in ledger.entries(client, name, "t" * 16)]
    assert sorted(places) == list(range(1, 11)), places
    assert np.all(np.diff(sorted(places)) == 1)


def _publish(
    tracking_uri: str,
    name: str,
    version: str,
    champion: str,
    start: threading.Barrier,
    live: set[str],
) -> None:
    """A publisher's turn and judgement of an equally good version (never promoted)."""
    start.wait()
    wait_for_turn(name, version, tracking_uri, version, lambda r: r in live, 60)
    correct = _correct(700)
    promote(
        name,
        version,
        _evaluation(correct),
        _rule(),
        tracking_uri,
        champion=_score(champion, correct),
    )
    live.discard(version)
