"""Collects the ranks' reports on the driver: a report is complete once every (required) rank
made it; its checkpoint is committed, its metrics kept, and it goes to the report callbacks in
turn (``report_callbacks``: watchdog, retention, validations, the run's callbacks). Also
answers the ranks' queries for the committed checkpoints."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from trainlib._internal.common.commit_marker import FileEntry
from trainlib._internal.common.messages import (
    CheckpointsAnswer,
    CheckpointsQuery,
    DriverMessage,
    RankLog,
    RankStarted,
    ReportMessage,
)
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.report_callbacks import (
    CompleteReport,
    HangWatch,
    ReportCallback,
    Retention,
    UserReports,
    ValidationRequests,
)
from trainlib._internal.driver.validation_queue import Validations
from trainlib._internal.driver.watchdog import ProgressWatchdog
from trainlib.callbacks import Callback
from trainlib.errors import ControllerError
from trainlib.validation import ValidationConfig

logger = logging.getLogger(__name__)

# (world rank, answer): the attempt's WorkerGroup.send_to
Reply = Callable[[int, CheckpointsAnswer], None]


class ReportCollector:
    """Turns per-rank ``ReportMessage``s into complete reports, in order."""

    def __init__(
        self,
        storage: RunStorage,
        manager: CheckpointManager,
        callbacks: Sequence[Callback],
        validation: ValidationConfig | None = None,
    ) -> None:
        self._storage = storage
        self._manager = manager
        self.validations = Validations(validation, self._validated)
        # the run's report callbacks, in turn; the attempt's watchdog first (``start_attempt``)
        self._run_callbacks: list[ReportCallback] = [
            Retention(manager),
            ValidationRequests(self.validations),
            UserReports(callbacks),
        ]
        self._report_callbacks = list(self._run_callbacks)
        self._history: list[tuple[int, dict[str, Any]]] = []
        self._pending: dict[int, list[ReportMessage]] = defaultdict(list)
        self._world_size = 0
        self._required: set[int] | None = None  # None: every rank (see ``relax_to``)
        self._processed = -1  # every report up to this index is complete
        self._queries: list[CheckpointsQuery] = []
        self._reply: Reply | None = None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Rank 0's metrics of every complete report, oldest first."""
        return [metrics for _, metrics in self._history]

    def start_attempt(self, world_size: int, start_index: int, watchdog: ProgressWatchdog) -> None:
        """Forget reports newer than the checkpoint this attempt resumes from."""
        self._world_size = world_size
        self._required = None
        self._report_callbacks = [HangWatch(watchdog), *self._run_callbacks]
        self._pending.clear()
        self._history = [(i, m) for i, m in self._history if i < start_index]
        self._processed = start_index - 1
        self._queries.clear()
        self._reply = None

    def relax_to(self, ranks: set[int]) -> None:
        """From now on a report is complete once ``ranks`` made it (the others are being
        preempted: ``FailureConfig(relax_collectives_on_preemption=True)``); reports waiting
        only for the others complete now, in order."""
        self._required = set(ranks)
        self._finish_ready()

    def _complete_enough(self, reports: list[ReportMessage]) -> bool:
        if self._required is None:
            return len(reports) == self._world_size
        return self._required <= {r.world_rank for r in reports}

    def reply_with(self, reply: Reply) -> None:
        """How to answer the ranks' ``get_all_reported_checkpoints`` in this attempt."""
        self._reply = reply

    def handle(self, message: DriverMessage) -> None:
        """Handle one message relayed from a rank: started, a report, a query for the
        committed checkpoints, or a rank-0 log record."""
        if isinstance(message, RankStarted):
            logger.info("Joined the group: %s", message.describe())
            for callback in self._report_callbacks:
                callback.after_rank_started(message.world_rank)
            return
        if isinstance(message, RankLog):
            # Already filtered by level in the rank; hand it to this process's handlers as
            # logging's socket receivers do (the logging cookbook).
            logging.getLogger(message.record.name).handle(message.record)
            return
        if isinstance(message, CheckpointsQuery):
            self._queries.append(message)
            self._answer_queries()
            return
        if message.index <= self._processed:
            return  # a preempted rank's late part of a report its survivors completed
        reports = self._pending[message.index]
        reports.append(message)
        for callback in self._report_callbacks:
            callback.after_rank_report(message.world_rank, message.index)
        self._finish_ready()

    def _finish_ready(self) -> None:
        """Complete the oldest waiting reports, in order, as long as they are complete."""
        while self._pending and self._complete_enough(self._pending[min(self._pending)]):
            self._finish_report(min(self._pending))

    def _finish_report(self, index: int) -> None:
        reports = self._pending.pop(index)
        self._complete(index, reports)
        self._processed = max(self._processed, index)
        self._answer_queries()

    def _answer_queries(self) -> None:
        """Answer the queries whose reports are all processed (and, when they ask, whose
        validations have ended): the committed checkpoints."""
        validating = self._manager.validating
        ready = [
            q
            for q in self._queries
            if q.index - 1 <= self._processed
            and not (q.validated and any(i < q.index for i in validating))
        ]
        if not ready or self._reply is None:
            return
        self._queries = [q for q in self._queries if q not in ready]
        answer = [
            (c.checkpoint, c.metrics, self._manager.status(c)) for c in self._manager.committed
        ]
        for query in ready:
            self._reply(query.world_rank, CheckpointsAnswer(answer))

    def _validated(self, index: int, metrics: dict[str, Any] | None) -> None:
        """A validation ended: its checkpoint and report take its metrics."""
        committed = self._manager.validated(index, metrics)
        if committed is not None and metrics is not None:
            self._history = [(i, {**m, **metrics} if i == index else m) for i, m in self._history]
        self._answer_queries()

    def check_all_complete(self) -> None:
        """Raise if some ranks called ``report()`` more often than others."""
        if self._pending:
            index = min(self._pending)
            ranks = sorted(m.world_rank for m in self._pending[index])
            raise ControllerError(
                f"Report {index} was made by ranks {ranks} only, out of {self._world_size}; "
                "every rank must call trainlib.report() the same number of times."
            )

    def _complete(self, index: int, reports: list[ReportMessage]) -> None:
        metrics = next(r.metrics for r in reports if r.world_rank == 0) or {}
        files, differing = _merged_files(reports)
        names = sorted({str(r.dir_name) for r in reports if r.files is not None})
        if len(names) > 1:
            raise ControllerError(
                f"Report {index} put its checkpoint under different names on different ranks "
                f"({', '.join(names)}); pass the same checkpoint_dir_name on every rank."
            )
        self._history.append((index, metrics))
        committed, validation = None, None
        if any(r.files is not None for r in reports):
            name = next(r.dir_name for r in reports if r.files is not None)
            ranked = sorted(reports, key=lambda r: r.world_rank)
            asked = [r.validation for r in ranked if r.validation is not None]
            validation = asked[0] if asked else None  # the lowest rank's, if several ask
            committed = self._storage.commit(index, files, metrics, name, differing, validation)
        report = CompleteReport(index, metrics, committed, validation)
        for callback in self._report_callbacks:
            callback.after_report(report)


def _merged_files(reports: Sequence[ReportMessage]) -> tuple[dict[str, FileEntry], set[str]]:
    """Every rank's files of one report as one checkpoint, and the paths that ranks reported
    with different contents (the storage keeps whichever was written last, as Ray's does)."""
    files: dict[str, FileEntry] = {}
    differing: set[str] = set()
    for report in reports:
        for rel, entry in (report.files or {}).items():
            if rel in files and files[rel].sha256 != entry.sha256:
                differing.add(rel)
            files[rel] = entry
    return files, differing
