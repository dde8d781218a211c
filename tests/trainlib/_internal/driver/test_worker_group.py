"""The worker group of one attempt: relaying messages as it is polled, saying how its ranks
are (``GroupStatus``), stopping them.

The supervisors' Dask tasks, their queue, the stop event and the client are stand-ins with the
same calls: no Dask cluster, no rank process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainlib import RankFailure
from trainlib._internal.common import wire
from trainlib._internal.common.messages import (
    Command,
    DriverMessage,
    PreemptionNotice,
    ReportMessage,
)
from trainlib._internal.driver import worker_group
from trainlib._internal.driver.ranks import assign_ranks
from trainlib._internal.driver.worker_group import WorkerGroup
from trainlib._internal.worker.supervisor import RankOutcome

SLOTS = assign_ranks([("host", "tcp://w0"), ("host", "tcp://w1")])


class Task:
    """A supervisor's Dask future."""

    def __init__(self, world_rank: int) -> None:
        self.key = f"trainlib-rank-{world_rank}"
        self.status = "pending"
        self._outcome: RankOutcome | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Task], None]] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self.status != "pending"

    def result(self) -> RankOutcome | None:
        return self._outcome

    def exception(self) -> BaseException | None:
        return self._error

    def add_done_callback(self, callback: Callable[[Task], None]) -> None:
        self._callbacks.append(callback)

    def end(self, outcome: RankOutcome | None = None, error: BaseException | None = None) -> None:
        with self._lock:
            if self.done():
                return
            self._outcome, self._error = outcome, error
            self.status = "finished" if error is None else "error"
        for callback in self._callbacks:
            callback(self)


class Mail:
    """The group's ``distributed.Queue``: messages as JSON text, bytes for the driver's own."""

    name = "trainlib-reports-test"

    def __init__(self) -> None:
        self._items: queue.Queue[str | bytes] = queue.Queue()

    def get(self) -> str | bytes:
        return self._items.get()

    def put(self, item: str | bytes) -> None:
        self._items.put(item)

    def say(self, message: DriverMessage) -> None:
        self.put(wire.encode(message))

    def close(self) -> None:
        pass


class StopEvent:
    """The group's stop event; setting it stops the ranks that ``obey``."""

    def __init__(self, tasks: list[Task], obey: set[int]) -> None:
        self._tasks = tasks
        self._obey = obey
        self.was_set = False

    def set(self) -> None:
        self.was_set = True
        for rank in self._obey:
            failure = RankFailure(rank, "host", "stopped", "stopped after another rank failed")
            self._tasks[rank].end(RankOutcome(rank, failure))

    def clear(self) -> None:
        pass


class Client:
    """What the group asks of its client: live workers and their status, the scheduler's log
    of a worker, cancelling, ``run`` on workers."""

    def __init__(self) -> None:
        self.live = {slot.address for slot in SLOTS}
        self.retiring: set[str] = set()
        self.events: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.runs: list[tuple[Any, tuple[Any, ...], list[str]]] = []
        self.scheduler = self
        self.address = "tcp://scheduler"
        self.identity = None

    def sync(self, function: Any, **kwargs: Any) -> dict[str, Any]:
        return {
            "workers": {
                address: {
                    "host": "host",
                    "status": "closing_gracefully" if address in self.retiring else "running",
                }
                for address in self.live
            }
        }

    def get_events(self, topic: str) -> list[tuple[float, dict[str, Any]]]:
        return self.events.get(topic, [])

    def cancel(self, futures: Any) -> None:
        pass

    def run(self, function: Any, *args: Any, workers: list[str], on_error: str) -> None:
        self.runs.append((function, args, workers))


class Pulse:
    """The driver's pulse sender: ``lapsed`` once the driver missed its beats."""

    timeout_s = 4.0

    def __init__(self) -> None:
        self.silent_for: float | None = None
        self.closed = False

    def lapsed(self) -> float | None:
        return self.silent_for

    def close(self) -> None:
        self.closed = True


class Setup:
    def __init__(self, obey: set[int]) -> None:
        self.pulse = Pulse()
        self.client = Client()
        self.tasks = [Task(0), Task(1)]
        self.mail = Mail()
        self.stop = StopEvent(self.tasks, obey)
        self.handled: list[DriverMessage] = []
        self.group = WorkerGroup(
            self.client,  # type: ignore[arg-type]
            SLOTS,
            self.tasks,  # type: ignore[arg-type]
            self.mail,  # type: ignore[arg-type]
            self.stop,  # type: ignore[arg-type]
            self.handled.append,
            self.pulse,  # type: ignore[arg-type]
        )

    def settle(self) -> dict[int, RankFailure]:
        """Poll as the controller does until every rank ended or one failed; then stop the
        others. The failures by rank."""
        while True:
            status = self.group.poll(0.05)
            if status.failures:
                return dict(self.group.stop().failures)
            if status.all_ended:
                return {}


@pytest.fixture
def ranks() -> Iterator[Setup]:
    setup = Setup(obey={0, 1})
    yield setup
    setup.group._shut_down()


def failure(rank: int, kind: Any = "exception") -> RankFailure:
    return RankFailure(rank, "host", kind, "RuntimeError: boom", time=0.0)


def test_worker_group_relays_every_message_until_every_rank_ends(ranks: Setup) -> None:
    for rank in (0, 1):
        ranks.tasks[rank].end(RankOutcome(rank, None))
    # said before its task ended, it may reach the driver after: still relayed
    ranks.mail.say(ReportMessage(0, 0, {"loss": 1.0}, None))
    ranks.mail.say(ReportMessage(1, 0, None, None))
    assert ranks.settle() == {}
    assert ranks.handled == [
        ReportMessage(0, 0, {"loss": 1.0}, None),
        ReportMessage(1, 0, None, None),
    ]
    assert not ranks.stop.was_set


def test_a_driver_that_missed_its_pulse_takes_every_rank_not_ended_well_for_fenced(
    ranks: Setup,
) -> None:
    """Frozen past its driver timeout, the driver cannot know what its ranks did meanwhile
    (they stopped themselves, or will): a rank that finished stays finished, the others are
    fenced, whatever else they said (a hang, an exit), and the group is stopped."""
    ranks.tasks[0].end(RankOutcome(0, None))
    assert ranks.group.poll(0.01).healthy
    ranks.pulse.silent_for = 9.5
    status = ranks.group.poll(0.01)
    assert set(status.failures) == {1}
    assert status.failures[1].kind == "fenced"
    assert "not heard from for 10 s (DaskConfig(driver_timeout_s=4))" in status.failures[1].summary
    assert ranks.group.fail({1: failure(1, "hang")}).failures[1].kind == "fenced"
    final = ranks.group.stop()
    assert ranks.stop.was_set and final.stopped
    assert {r: f.kind for r, f in final.failures.items()} == {1: "fenced"}
    ranks.group._shut_down()
    assert ranks.pulse.closed


def test_worker_group_failure_stops_the_other_ranks(ranks: Setup) -> None:
    ranks.tasks[1].end(RankOutcome(1, failure(1)))
    failures = ranks.settle()
    assert ranks.stop.was_set
    assert failures[1].kind == "exception"
    assert failures[0].kind == "stopped"
    assert ranks.group.unresponsive_workers == set()


def test_worker_group_rank_that_does_not_stop_makes_its_worker_unresponsive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_group, "STOP_TIMEOUT_S", 0.3)
    setup = Setup(obey=set())  # rank 0's task never ends
    setup.tasks[1].end(RankOutcome(1, failure(1)))
    failures = setup.settle()
    assert failures[0].kind == "worker_lost"
    assert "did not stop within 0.3 s" in failures[0].summary
    assert setup.group.unresponsive_workers == {"tcp://w0"}
    setup.group._shut_down()


def test_worker_group_worker_that_left_loses_its_rank(ranks: Setup) -> None:
    ranks.client.live = {"tcp://w0"}
    failures = ranks.settle()
    assert failures[1].kind == "worker_lost"
    assert "tcp://w1 left the cluster" in failures[1].summary
    assert failures[0].kind == "stopped"
    assert ranks.group.unresponsive_workers == {"tcp://w1"}


def test_worker_group_worker_that_retired_gracefully_is_a_preemption(ranks: Setup) -> None:
    # too quick for a liveness check to see it retiring: the scheduler's log of it says so
    ranks.client.events["tcp://w1"] = [
        (1.0, {"action": "worker-status-change", "status": "closing_gracefully"}),
        (2.0, {"action": "remove-worker", "expected": True}),
    ]
    ranks.client.live = {"tcp://w0"}
    failures = ranks.settle()
    assert failures[1].kind == "preempted"
    assert "tcp://w1 retired gracefully (preempted)" in failures[1].summary
    assert failures[0].kind == "stopped"  # rank 0's worker did not retire


def test_worker_group_tells_every_rank_when_a_worker_starts_retiring(ranks: Setup) -> None:
    ranks.client.retiring = {"tcp://w1"}
    ranks.tasks[0].end(RankOutcome(0, failure(0, kind="stopped")))
    ranks.tasks[1].end(RankOutcome(1, failure(1, kind="exit")))  # killed as its worker closed
    failures = ranks.settle()
    notices = [r for r in ranks.client.runs if isinstance(r[1][1], PreemptionNotice)]
    [(_, (_, notice), workers)] = notices
    assert workers == ["tcp://w0", "tcp://w1"]
    assert notice.info.preempted_node_to_ranks == {"tcp://w1": [1]}
    assert failures[1].kind == "preempted"


def test_worker_group_task_that_failed_in_dask_is_a_failed_rank(ranks: Setup) -> None:
    ranks.tasks[0].end(error=OSError("worker died"))
    failures = ranks.settle()
    assert failures[0].kind == "exception"
    assert "Dask task failed on tcp://w0" in failures[0].summary
    assert "worker died" in failures[0].summary


def test_worker_group_hung_ranks_named_by_the_watchdog_fail_the_attempt(ranks: Setup) -> None:
    status = ranks.group.fail({1: failure(1, "hang")})
    assert set(status.failures) == {1} and not status.all_ended
    failures = ranks.group.stop().failures
    assert failures[1].kind == "hang"
    assert failures[0].kind == "stopped"


def test_worker_group_poll_relays_messages_with_the_ranks_running(ranks: Setup) -> None:
    ranks.mail.say(ReportMessage(0, 0, {}, None))
    status = ranks.group.poll(5.0)  # the message ends the wait
    assert ranks.handled == [ReportMessage(0, 0, {}, None)]
    assert status.healthy and not status.ended and status.size == 2
    assert not ranks.stop.was_set
    assert not any(task.done() for task in ranks.tasks)


def test_worker_group_left_with_ranks_running_stops_them(ranks: Setup) -> None:
    ranks.group.poll(0.0)
    ranks.group._shut_down()
    assert ranks.stop.was_set
    assert all(task.done() for task in ranks.tasks)


def test_worker_group_status_names_the_ranks_of_a_retiring_worker(ranks: Setup) -> None:
    ranks.client.retiring = {"tcp://w1"}
    while not (status := ranks.group.poll(0.05)).retiring:  # the next liveness check sees it
        assert status.healthy
    assert status.retiring == {1}
    assert status.healthy and not status.ended


def test_worker_group_sends_a_command_to_every_rank_or_to_one(ranks: Setup) -> None:
    ranks.group.send(Command("train"))
    ranks.group.send_to(1, Command("answer"))
    sent = [(args[1].kind, workers) for _, args, workers in ranks.client.runs]
    assert sent == [("train", ["tcp://w0", "tcp://w1"]), ("answer", ["tcp://w1"])]
    assert all(args[0] == ranks.mail.name for _, args, _ in ranks.client.runs)


def test_worker_group_hung_rank_whose_task_does_not_end_makes_its_worker_unresponsive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_group, "STOP_TIMEOUT_S", 0.3)
    setup = Setup(obey={1})  # rank 0 hangs and its task never ends, even when stopped
    setup.group.fail({0: failure(0, "hang")})
    failures = setup.group.stop().failures
    assert failures[0].kind == "hang"
    assert setup.group.unresponsive_workers == {"tcp://w0"}
    setup.group._shut_down()
