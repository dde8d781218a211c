"""What a complete report goes to, as Ray Train v2 passes each report to its report callbacks:
the hang watchdog (progress), the checkpoint manager (retention), the validations
(``report(validation=)``) and the run's own callbacks (``Callback.on_report``). The report
collector (``report_collector``) makes the report complete and commits its checkpoint, then
tells each callback in turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.callbacks import Callback, Report

if TYPE_CHECKING:
    from trainlib._internal.common.commit_marker import CommittedCheckpoint
    from trainlib._internal.driver.checkpoint_manager import CheckpointManager
    from trainlib._internal.driver.validation_queue import Validations
    from trainlib._internal.driver.watchdog import ProgressWatchdog


@dataclass(frozen=True)
class CompleteReport:
    """A report every (required) rank made: rank 0's metrics, the checkpoint committed with
    it (if any) and the validation it asked for (if any)."""

    index: int
    metrics: dict[str, Any]
    committed: CommittedCheckpoint | None = None
    validation: dict[str, Any] | None = None


class ReportCallback:
    """A report's way through the driver; each hook does nothing unless overridden."""

    def after_rank_started(self, world_rank: int) -> None:
        """A rank joined the process group."""

    def after_rank_report(self, world_rank: int, index: int) -> None:
        """A rank made its part of report ``index``."""

    def after_report(self, report: CompleteReport) -> None:
        """Report ``report.index`` is complete (its checkpoint committed)."""


class HangWatch(ReportCallback):
    """The attempt's hang watchdog sees the ranks start, report and make progress."""

    def __init__(self, watchdog: ProgressWatchdog) -> None:
        self._watchdog = watchdog

    def after_rank_started(self, world_rank: int) -> None:
        self._watchdog.on_started(world_rank)

    def after_rank_report(self, world_rank: int, index: int) -> None:
        self._watchdog.on_report(world_rank, index)

    def after_report(self, report: CompleteReport) -> None:
        self._watchdog.on_complete()


class Retention(ReportCallback):
    """The checkpoint manager keeps each committed checkpoint (those falling out deleted)."""

    def __init__(self, manager: CheckpointManager) -> None:
        self._manager = manager

    def after_report(self, report: CompleteReport) -> None:
        if report.committed is not None:
            self._manager.register(report.committed, validating=report.validation is not None)


class ValidationRequests(ReportCallback):
    """A checkpoint whose report asked for a validation is queued for it."""

    def __init__(self, validations: Validations) -> None:
        self._validations = validations

    def after_report(self, report: CompleteReport) -> None:
        if report.committed is not None and report.validation is not None:
            self._validations.request(report.committed, report.validation)


class UserReports(ReportCallback):
    """The run's own callbacks get the report (``Callback.on_report``)."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self._callbacks = callbacks

    def after_report(self, report: CompleteReport) -> None:
        checkpoint = report.committed.checkpoint if report.committed is not None else None
        for callback in self._callbacks:
            callback.on_report(Report(report.index, report.metrics, checkpoint))
