"""What one run keeps across its attempts, whichever controller runs it (``controller`` on a
Dask cluster, ``local_mode`` in this thread): its name and storage, checkpoints, reports,
callbacks, failures and lifecycle, and its Result."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import cloudpickle

from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.controller_state import (
    Aborted,
    ControllerState,
    Errored,
    Finished,
    Lifecycle,
)
from trainlib._internal.driver.delivery import end_run, with_delivery
from trainlib._internal.driver.failure_policy import FailurePolicy
from trainlib._internal.driver.report_collector import ReportCollector
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.callbacks import Report, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.result import Result

logger = logging.getLogger(__name__)


class RunCancelled(Exception):
    """The run was stopped from outside (``RunPlan.cancel``), not by its own failure."""


class RunRecord:
    """One run's storage, checkpoints, reports and failures, across its attempts."""

    def __init__(self, plan: RunPlan) -> None:
        config = plan.run_config
        self.plan = plan
        self.name = config.name or datetime.now(timezone.utc).strftime(
            f"{plan.default_name_prefix}_%Y-%m-%d_%H-%M-%S"
        )
        self.lifecycle = Lifecycle(self.name)
        self.storage = RunStorage.create(config.storage, self.name, config.storage_filesystem)
        self.manager = CheckpointManager.from_storage(config.checkpoint_config, self.storage)
        # as the run calls them: trackers behind their deliveries (never stopping the run)
        self.callbacks = with_delivery(config.callbacks)
        self.collector = ReportCollector(
            self.storage, self.manager, self.callbacks, plan.validation
        )
        self.failure_policy = FailurePolicy(config.failure_config)
        setup = plan.scaling.worker_setup
        self.setup_payload = cloudpickle.dumps(setup) if setup is not None else None
        self._started = False

    @property
    def attempt(self) -> int:
        """The number of the current (or next) attempt, from 1."""
        return len(self.failure_policy.failures) + 1

    def resume_point(self) -> tuple[int, Checkpoint | None]:
        """Where the next attempt starts: its first report's index and the checkpoint it
        resumes from (the latest intact one, else the plan's). A checkpoint a stopped attempt
        never committed is deleted first."""
        self.storage.remove_uncommitted()
        latest = self.manager.latest_intact()
        if latest is None:
            return 0, self.plan.resume_from
        return latest.index + 1, latest.checkpoint

    def start_callbacks(self, ranks: int) -> None:
        """Tell the callbacks, once, that the run starts on ``ranks`` ranks (and what it
        resumes)."""
        if self._started:
            return
        self._started = True
        committed = tuple(Report(c.index, c.metrics, c.checkpoint) for c in self.manager.committed)
        resumed = committed[-1] if committed else None
        info = RunInfo(self.name, self.storage.run_dir, ranks, resumed, committed)
        for callback in self.callbacks:
            callback.on_start(info)

    def remove_uncommitted(self) -> None:
        """After a run was stopped (Ctrl-C, a cancelled trial) with its ranks gone: a checkpoint
        they were writing can never be committed, so it is deleted now rather than at the next
        start (a failure to delete it is logged: the next start deletes it, and it is never
        taken for a checkpoint meanwhile). After a failure it stays until the next start."""
        try:
            self.storage.remove_uncommitted()
        except Exception as exc:
            logger.warning("Run %s: incomplete checkpoints left (%s)", self.name, exc)

    def result(self, error: BaseException | None) -> Result:
        """The run's Result so far (``error`` is what ended it, if anything)."""
        latest = self.manager.latest
        history = self.collector.history
        return Result(
            metrics=history[-1] if history else {},
            checkpoint=latest.checkpoint if latest else None,
            best_checkpoints=self.manager.kept,
            path=self.storage.run_dir,
            filesystem=self.storage.filesystem,
            error=error,
            metrics_history=history,
            failures=self.failure_policy.failures,
        )

    def end(self, error: BaseException | None) -> Result:
        """Tell the callbacks the run ended (``error``: what ended it) and return its Result."""
        result = self.result(error)
        end_run(self.callbacks, result)
        return result

    def conclude(self, error: BaseException | None) -> Result:
        """End the run: the callbacks told, its terminal state entered, its Result returned
        (or ``error``, what ended it, raised)."""
        stopped = isinstance(error, (KeyboardInterrupt, RunCancelled))
        if stopped:
            self.remove_uncommitted()
        result = self.end(error)
        state: ControllerState = Finished()
        if error is not None:
            state = (Aborted if stopped else Errored)(type(error).__name__)
        self.lifecycle.enter(state)
        if error is not None:
            raise error  # the caller reports it; logging it here too would say it twice
        return result
