"""The report callbacks on generated complete reports: the checkpoint manager keeps each
committed checkpoint (marked validating when a validation was asked for), a validation is
queued only for a committed checkpoint that asked, the run's callbacks get every report with
its checkpoint, and the hang watchdog sees the ranks start, report and make progress."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib import Callback, Checkpoint, Report
from trainlib._internal.common.commit_marker import CommittedCheckpoint
from trainlib._internal.driver.ranks import assign_ranks
from trainlib._internal.driver.report_callbacks import (
    CompleteReport,
    HangWatch,
    Retention,
    UserReports,
    ValidationRequests,
)
from trainlib._internal.driver.watchdog import ProgressWatchdog


class Manager:
    def __init__(self) -> None:
        self.registered: list[tuple[int, bool]] = []

    def register(self, committed: CommittedCheckpoint, validating: bool = False) -> None:
        self.registered.append((committed.index, validating))


class Validations:
    def __init__(self) -> None:
        self.requested: list[tuple[int, dict[str, Any]]] = []

    def request(self, committed: CommittedCheckpoint, overrides: dict[str, Any]) -> None:
        self.requested.append((committed.index, overrides))


class Reports(Callback):
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def on_report(self, report: Report) -> None:
        self.reports.append(report)


REPORT = st.tuples(st.booleans(), st.none() | st.dictionaries(st.sampled_from("ab"), st.integers()))


@settings(max_examples=200, deadline=None)
@given(reports=st.lists(REPORT, max_size=8))
def test_each_report_callback_over_generated_reports(
    reports: list[tuple[bool, dict[str, Any] | None]],
) -> None:
    manager, validations, user = Manager(), Validations(), Reports()
    callbacks = [
        Retention(manager),  # type: ignore[arg-type]
        ValidationRequests(validations),  # type: ignore[arg-type]
        UserReports([user]),
    ]
    expected_kept, expected_asked, expected_reports = [], [], []
    for index, (checkpointed, validation) in enumerate(reports):
        checkpoint = Checkpoint(f"/runs/r/checkpoint_{index:06d}") if checkpointed else None
        committed = None
        if checkpoint is not None:
            committed = CommittedCheckpoint(index, checkpoint, {"i": index}, {})
            expected_kept.append((index, validation is not None))
            if validation is not None:
                expected_asked.append((index, validation))
        for callback in callbacks:
            callback.after_report(CompleteReport(index, {"i": index}, committed, validation))
        expected_reports.append(Report(index, {"i": index}, checkpoint))
    assert manager.registered == expected_kept
    assert validations.requested == expected_asked
    assert user.reports == expected_reports


def test_the_hang_watch_starts_the_clock_once_every_rank_joined_and_counts_progress() -> None:
    now = [0.0]
    slots = assign_ranks([("host", "tcp://w0"), ("host", "tcp://w1")])
    watchdog = ProgressWatchdog(5.0, slots, clock=lambda: now[0])
    watch = HangWatch(watchdog)
    watch.after_rank_started(0)
    now[0] = 100.0
    assert watchdog.check() == {}  # rank 1 has not joined: start-up is not watched
    watch.after_rank_started(1)
    watch.after_rank_report(0, 0)
    now[0] = 106.0
    assert set(watchdog.check()) == {1}  # behind rank 0 for longer than the timeout
    watch.after_rank_report(1, 0)
    watch.after_report(CompleteReport(0, {}))
    assert watchdog.check() == {}
