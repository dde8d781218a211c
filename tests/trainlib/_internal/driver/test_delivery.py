"""A tracking callback's records: delivered in order, each once, off the training's path,
through an outage of its service; never a reason for the run to stop."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from trainlib import Callback, GroupInfo, Report, Result, RunInfo, TrackingCallback
from trainlib._internal.driver.delivery import Delivery, end_run, with_delivery


class Service(TrackingCallback):
    """A tracker whose service is out of reach until ``up`` is set; records what reached it."""

    service = "the test service"

    def __init__(self, tolerance_s: float = 60.0, refuse: int | None = None) -> None:
        self.outage_tolerance_s = tolerance_s
        self.up = threading.Event()
        self.up.set()
        self.received: list[str] = []
        self.tries = 0
        self._refuse = refuse

    def is_transient(self, error: Exception) -> bool:
        return isinstance(error, ConnectionError)

    def on_start(self, run: RunInfo) -> None:
        self._receive("start")

    def on_report(self, report: Report) -> None:
        if report.index == self._refuse:
            raise ValueError(f"report {report.index} is refused")
        self._receive(f"report {report.index}")

    def on_end(self, result: Result) -> None:
        self._receive("end")

    def on_group_start(self, group: GroupInfo) -> None:
        raise ConnectionError("down while the group starts")

    def _receive(self, what: str) -> None:
        self.tries += 1
        if not self.up.is_set():
            raise ConnectionError("connection refused")
        self.received.append(what)


def _report(index: int) -> Report:
    return Report(index, {"loss": 1.0 / (index + 1)}, None)


def _result() -> Result:
    return Result(
        metrics={}, checkpoint=None, best_checkpoints=[], path="/nowhere", filesystem=None
    )


def test_delivery_records_arrive_in_order_each_once_through_an_outage() -> None:
    service = Service()
    delivery = Delivery(service)
    delivery.on_start(RunInfo("run", "/nowhere", 2))
    while delivery.waiting:
        time.sleep(0.01)
    service.up.clear()
    started = time.monotonic()
    for index in range(5):
        delivery.on_report(_report(index))  # the training's side: never waits for the service
    assert time.monotonic() - started < 0.5
    while service.tries < 3:  # the first report was tried, failed and tried again
        time.sleep(0.05)
    assert delivery.waiting == 5
    service.up.set()
    end_run([delivery], _result())
    assert service.received == ["start", *(f"report {i}" for i in range(5)), "end"]
    assert delivery.waiting == 0


def test_delivery_thread_ends_with_the_run() -> None:
    """A run's delivery thread ends once the run's end is delivered: a process that runs many
    fits (a worker, a notebook, a test session) keeps no idle thread per run."""
    delivery = Delivery(Service())
    delivery.on_start(RunInfo("run", "/nowhere", 2))
    thread = delivery._thread
    assert thread is not None and thread.is_alive()
    end_run([delivery], _result())
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_delivery_a_refused_record_is_dropped_saying_so(caplog: pytest.LogCaptureFixture) -> None:
    service = Service(refuse=1)
    delivery = Delivery(service)
    with caplog.at_level(logging.WARNING):
        for index in range(3):
            delivery.on_report(_report(index))
        end_run([delivery], _result())
    assert service.received == ["report 0", "report 2", "end"]
    assert "refused report 1, which is dropped: ValueError: report 1 is refused" in caplog.text
    assert "the test service" in caplog.text


def test_delivery_the_run_end_waits_no_longer_than_the_tolerance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = Service(tolerance_s=1.0)
    service.up.clear()
    delivery = Delivery(service)
    with caplog.at_level(logging.WARNING):
        delivery.on_report(_report(0))
        started = time.monotonic()
        end_run([delivery], _result())
    waited = time.monotonic() - started
    assert 0.0 < waited < 3.0
    assert service.received == []
    assert "Service (the test service) has not answered for" in caplog.text
    assert "without waiting for report 0, the run's end" in caplog.text
    assert "is out of reach (ConnectionError: connection refused): training goes on" in caplog.text
    service.up.set()  # still retried while the process runs
    deadline = time.monotonic() + 60
    while service.received != ["report 0", "end"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert service.received == ["report 0", "end"]


def test_delivery_group_calls_are_made_in_place_and_never_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    delivery = Delivery(Service())
    with caplog.at_level(logging.WARNING):
        delivery.on_group_start(GroupInfo(1, (), None))
    assert "on_group_start failed (down while the group starts); training goes on" in caplog.text


class Decider(Callback):
    def __init__(self) -> None:
        self.ended = False

    def on_end(self, result: Result) -> None:
        self.ended = True
        raise RuntimeError("the decider's check failed")


def test_delivery_only_trackers_are_delivered_and_a_deciders_error_is_raised_last() -> None:
    decider, service = Decider(), Service()
    callbacks = with_delivery([decider, service])
    assert callbacks[0] is decider
    assert isinstance(callbacks[1], Delivery) and callbacks[1].tracker is service
    with pytest.raises(RuntimeError, match="the decider's check failed"):
        end_run(callbacks, _result())
    assert decider.ended
    assert service.received == ["end"]  # told, and delivered, before the error was raised
