"""The run controller: one training run from start to Result, through its attempts.

A short state machine, as Ray Train's controller: starting -> running -> (restarting ->
running)* -> finished | errored. Each state change is logged once. Front ends (TorchTrainer,
a Tuner trial) build a ``RunPlan`` and call ``run_training``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import cloudpickle

from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.delivery import end_run, with_delivery
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.reports import ReportCollector
from trainlib._internal.driver.run_plan import AttemptStart, RunPlan, rank_launch
from trainlib._internal.driver.watchdog import ProgressWatchdog
from trainlib.callbacks import GroupInfo, Report, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.errors import RankFailure, WorkerGroupError
from trainlib.result import Result

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.gpu_claims import GpuClaims
    from trainlib._internal.driver.ranks import WorkerSlot
    from trainlib._internal.driver.resize import GrowthWatch
    from trainlib._internal.driver.worker_group import WorkerGroup

logger = logging.getLogger(__name__)


class RunCancelled(Exception):
    """The run was stopped from outside (``RunPlan.cancel``), not by its own failure."""


def run_training(plan: RunPlan, client: Client | None = None) -> Result:
    """Run ``plan`` to its end on ``client`` (or on the cluster its DaskConfig names).

    Ctrl-C in the main thread stops every rank and raises ``KeyboardInterrupt`` here.

    Raises:
        WorkerGroupError: A rank failed more often than ``FailureConfig.max_failures``.
        NotEnoughWorkersError: The cluster cannot provide ``num_workers`` workers.
    """
    with InterruptWatch():
        return Run(plan).execute(client)


class Run:
    """One run's storage, checkpoints, reports and failures, across its attempts."""

    def __init__(self, plan: RunPlan) -> None:
        config = plan.run_config
        self.plan = plan
        self.name = config.name or datetime.now(timezone.utc).strftime(
            f"{plan.default_name_prefix}_%Y-%m-%d_%H-%M-%S"
        )
        self.storage = RunStorage.create(config.storage, self.name, config.storage_filesystem)
        self.manager = CheckpointManager.from_storage(config.checkpoint_config, self.storage)
        # as the run calls them: trackers behind their deliveries (never stopping the run)
        self.callbacks = with_delivery(config.callbacks)
        self.collector = ReportCollector(
            self.storage, self.manager, self.callbacks, plan.validation
        )
        self.failures: list[RankFailure] = []  # every failed attempt's root cause
        self.preemptions = 0  # of those, the preemptions max_preemption_failures covered
        self.unresponsive: set[str] = set()
        self.started = False
        setup = plan.scaling.worker_setup
        self.setup_payload = cloudpickle.dumps(setup) if setup is not None else None

    def execute(self, client: Client | None) -> Result:
        from trainlib._internal.driver import (
            cluster,  # imported on use: rank processes never need Dask
        )
        from trainlib._internal.driver.local_mode import run_locally

        error: BaseException | None = None
        try:
            workers = self.plan.scaling.worker_range[1]
            if workers == 0:
                run_locally(self)
            else:
                with cluster.connect(self.plan.dask_config, workers, client) as connected:
                    self._attempts(connected)
        except BaseException as exc:
            error = exc
            if isinstance(exc, (KeyboardInterrupt, RunCancelled)):
                self._remove_uncommitted()
        result = self.result(error)
        end_run(self.callbacks, result)
        if error is not None:
            logger.info("Run %s ended with %s", self.name, type(error).__name__)
            raise error  # the caller reports it; logging it here too would say it twice
        logger.info("Run %s finished", self.name)
        return result

    def _remove_uncommitted(self) -> None:
        """After a run was stopped (Ctrl-C, a cancelled trial) with its ranks gone: a checkpoint
        they were writing can never be committed, so it is deleted now rather than at the next
        start (a failure to delete it is logged: the next start deletes it, and it is never
        taken for a checkpoint meanwhile). After a failure it stays until the next start."""
        try:
            self.storage.remove_uncommitted()
        except Exception as exc:
            logger.warning("Run %s: incomplete checkpoints left (%s)", self.name, exc)

    def _attempts(self, client: Client) -> None:
        """Attempts until one succeeds or ``max_failures`` is used up, then the validations."""
        from trainlib._internal.worker import preemption_retirement
        from trainlib._internal.worker.rank_pool import RankPoolPlugin

        client.register_plugin(RankPoolPlugin())
        preemption_retirement.register(client)
        validations = self.collector.validations
        validations.use(client)
        try:
            validations.resume(self.manager.awaiting_validation())
            self._until_trained(client)
            validations.wait(self.poll)  # fit() returns with every checkpoint validated
        finally:
            validations.cancel()  # those not ended when the run stops otherwise

    def _until_trained(self, client: Client) -> None:
        from trainlib._internal.driver.gpu_claims import GpuClaims

        with GpuClaims(client, self.name) as claims:  # the run's GPUs, across its attempts
            self._attempt_until_trained(client, claims)

    def _attempt_until_trained(self, client: Client, claims: GpuClaims) -> None:
        from trainlib._internal.driver.preemption_grace import PreemptionGrace

        failure_config = self.plan.run_config.failure_config
        while True:
            with self.attempt(client, claims) as (group, watchdog):
                growth = self._growth(client, group.size)
                grace = PreemptionGrace(failure_config, self.collector, self.manager, group.size)
                attempt_failures = group.run(
                    self.collector.handle,
                    watchdog.check,
                    poll=self.poll,
                    until=growth.due,
                    grace=grace,
                )
            if growth.fired:  # the ranks were stopped on leaving the attempt: not a failure
                logger.info(
                    "Run %s: %d eligible Dask workers for its %d ranks (up to %d); re-forming "
                    "the group from the latest checkpoint",
                    self.name,
                    growth.available,
                    group.size,
                    self.plan.scaling.worker_range[1],
                )
                continue
            if not attempt_failures:
                self.collector.check_all_complete()
                return
            error = self.record_failure(attempt_failures)
            if self._absorbs_preemption(error.root_cause):
                logger.warning(
                    "Run %s restarting after preemption %d: %s",
                    self.name,
                    self.preemptions,
                    error.root_cause.one_line(),
                )
                continue
            counted = len(self.failures) - self.preemptions
            if failure_config.max_failures != -1 and counted > failure_config.max_failures:
                raise error
            logger.warning(
                "Run %s restarting after failure %d: %s",
                self.name,
                counted,
                error.root_cause.one_line(),
            )

    def _absorbs_preemption(self, root_cause: RankFailure) -> bool:
        """Whether a failed attempt was a preemption that ``max_preemption_failures`` still
        covers (then it is counted there, not against ``max_failures``)."""
        budget = self.plan.run_config.failure_config.max_preemption_failures
        if root_cause.kind != "preempted" or (budget != -1 and self.preemptions >= budget):
            return False
        self.preemptions += 1
        return True

    def _growth(self, client: Client, group_size: int) -> GrowthWatch:
        """When this attempt's elastic group should grow (never for a search's trial, whose
        workers the search hands out)."""
        from trainlib._internal.driver.resize import watch_growth

        scaling = self.plan.scaling
        if self.plan.lease is not None:
            scaling = replace(scaling, num_workers=group_size)  # a full group: never grows
        return watch_growth(client, scaling, group_size, self.manager)

    @contextmanager
    def attempt(
        self, client: Client, claims: GpuClaims
    ) -> Iterator[tuple[WorkerGroup, ProgressWatchdog]]:
        """Form the next group, resuming from the latest intact checkpoint (or the plan's), its
        GPUs claimed in the run's ``claims``; on leaving, its ranks are stopped. Workers
        unresponsive before are avoided."""
        from trainlib._internal.driver import worker_selection
        from trainlib._internal.driver.worker_group import WorkerGroup

        self.storage.remove_uncommitted()
        latest = self.manager.latest_intact()
        start_index = latest.index + 1 if latest else 0
        resume_from = latest.checkpoint if latest else self.plan.resume_from
        slots = worker_selection.select_workers(
            client,
            self.plan.scaling,
            self.plan.dask_config.worker_timeout_s,
            frozenset(self.unresponsive),
            poll=self.poll,
            allowed=self.plan.lease.allowed if self.plan.lease else None,
            claims=claims if self.plan.scaling.use_gpu else None,
        )
        self._check_datasets(client, len(slots))
        self.announce(slots, resume_from)
        watchdog = ProgressWatchdog(self.plan.run_config.failure_config.hang_timeout_s, slots)
        self.collector.start_attempt(len(slots), start_index, watchdog)
        start = AttemptStart(
            self.plan, self.name, self.storage, start_index, resume_from, slots, self.setup_payload
        )
        build = functools.partial(rank_launch, start)
        resources = dict(self.plan.scaling.resources_per_worker or {}) or None
        group: WorkerGroup | None = None
        ranks = tuple(s.placement() for s in sorted(slots, key=lambda slot: slot.world_rank))
        info = GroupInfo(len(self.failures) + 1, ranks, client)
        callbacks = self.callbacks
        try:
            with WorkerGroup.start(client, slots, build, resources) as group:
                self.collector.reply_with(group.send_to)
                for callback in callbacks:
                    callback.on_group_start(info)
                try:
                    yield group, watchdog
                finally:
                    for callback in callbacks:
                        callback.on_group_end(info)
        finally:  # also when the run stops by raising (a pruned trial, Ctrl-C)
            if group is not None:  # known once the group was stopped
                self.unresponsive |= group.unresponsive_workers
                if self.plan.lease is not None:
                    self.plan.lease.withhold(group.unresponsive_workers)

    def poll(self) -> None:
        """Raise to stop the run: ``KeyboardInterrupt`` after Ctrl-C; ``RunCancelled`` once the
        plan's ``cancel`` is set (the search running it as a trial stopped)."""
        InterruptWatch.check()
        self.collector.validations.poll()
        if self.plan.cancel is not None and self.plan.cancel.is_set():
            raise RunCancelled(f"Run {self.name} was stopped: the search that started it stopped")

    def record_failure(self, failures: dict[int, RankFailure]) -> WorkerGroupError:
        """Count a failed attempt; the error to raise if no restart follows."""
        error = WorkerGroupError(failures, num_restarts=len(self.failures))
        self.failures.append(error.root_cause)
        return error

    def _check_datasets(self, client: Client, world_size: int) -> None:
        """Fail before any rank starts if a split dataset has fewer rows than ranks."""
        from trainlib._internal.common.datasets import check_rows

        for source in self.plan.datasets:
            check_rows(source, world_size, client)

    def announce(self, slots: list[WorkerSlot], resume_from: Checkpoint | None) -> None:
        """Tell the callbacks (first attempt) and the log that a group of this size forms."""
        if not self.started:
            self.started = True
            committed = tuple(
                Report(c.index, c.metrics, c.checkpoint) for c in self.manager.committed
            )
            resumed = committed[-1] if committed else None
            info = RunInfo(self.name, self.storage.run_dir, len(slots), resumed, committed)
            for callback in self.callbacks:
                callback.on_start(info)
        logger.info(
            "Run %s starting (attempt %d) on %d ranks from %s",
            self.name,
            len(self.failures) + 1,
            len(slots),
            resume_from or "scratch",
        )

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
            failures=self.failures,
        )
