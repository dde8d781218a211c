"""The run controller: one training run from start to Result, through its attempts.

A short state machine, as Ray Train's controller: starting -> running -> (restarting ->
running)* -> finished | errored. Each state change is logged once. Front ends (TorchTrainer,
a Tuner trial) build a ``RunPlan`` and call ``run_training``.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import cloudpickle

from trainlib._internal.common.messages import RankLaunch, RankSpec
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.reports import ReportCollector
from trainlib._internal.driver.watchdog import ProgressWatchdog
from trainlib._internal.rank import backend
from trainlib.callbacks import Report, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import DaskConfig, RunConfig, ScalingConfig, TorchConfig
from trainlib.data.cache import CachePlan
from trainlib.data.config import DataConfig
from trainlib.errors import RankFailure, WorkerGroupError
from trainlib.result import Result

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.common.datasets import DatasetSource
    from trainlib._internal.driver.leases import WorkerLease
    from trainlib._internal.driver.ranks import WorkerSlot
    from trainlib._internal.driver.worker_group import WorkerGroup
    from trainlib._internal.worker.feeder import FeedPlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """Everything one run needs, as its front end resolved it."""

    train_func_payload: bytes
    scaling: ScalingConfig
    run_config: RunConfig
    torch_config: TorchConfig
    dask_config: DaskConfig
    resume_from: Checkpoint | None = None
    datasets: tuple[DatasetSource, ...] = ()
    data_config: DataConfig = field(default_factory=DataConfig)
    default_name_prefix: str = "TorchTrainer"
    lease: WorkerLease | None = None  # a Tuner trial: select ranks only among its workers


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
        self.storage = RunStorage.create(config.storage_path, self.name, config.storage_filesystem)
        self.manager = CheckpointManager.from_storage(config.checkpoint_config, self.storage)
        self.collector = ReportCollector(self.storage, self.manager, config.callbacks)
        self.failures: list[RankFailure] = []
        self.unresponsive: set[str] = set()
        self.started = False
        setup = plan.scaling.worker_setup
        self.setup_payload = cloudpickle.dumps(setup) if setup is not None else None

    def execute(self, client: Client | None) -> Result:
        from trainlib._internal.driver import (
            cluster,  # imported on use: rank processes never need Dask
        )

        error: BaseException | None = None
        try:
            workers = self.plan.scaling.worker_range[1]
            with cluster.connect(self.plan.dask_config, workers, client) as connected:
                self._attempts(connected)
        except BaseException as exc:
            error = exc
        result = self.result(error)
        for callback in self.plan.run_config.callbacks:
            callback.on_end(result)
        if error is not None:
            logger.info("Run %s ended with %s", self.name, type(error).__name__)
            raise error  # the caller reports it; logging it here too would say it twice
        logger.info("Run %s finished", self.name)
        return result

    def _attempts(self, client: Client) -> None:
        """Attempts until one succeeds or ``max_failures`` is used up."""
        from trainlib._internal.worker.rank_pool import RankPoolPlugin

        client.register_plugin(RankPoolPlugin())
        failure_config = self.plan.run_config.failure_config
        while True:
            with self.attempt(client) as (group, watchdog):
                attempt_failures = group.run(
                    self.collector.handle, watchdog.check, poll=InterruptWatch.check
                )
            if not attempt_failures:
                self.collector.check_all_complete()
                return
            error = self.record_failure(attempt_failures)
            if (
                failure_config.max_failures != -1
                and len(self.failures) > failure_config.max_failures
            ):
                raise error
            logger.warning(
                "Run %s restarting after failure %d: %s",
                self.name,
                len(self.failures),
                error.root_cause.one_line(),
            )

    @contextmanager
    def attempt(self, client: Client) -> Iterator[tuple[WorkerGroup, ProgressWatchdog]]:
        """Form the next group, resuming from the latest intact checkpoint (or the plan's);
        on leaving, its ranks are stopped. Workers unresponsive before are avoided."""
        from trainlib._internal.driver import cluster
        from trainlib._internal.driver.worker_group import WorkerGroup

        self.storage.remove_uncommitted()
        latest = self.manager.latest_intact()
        start_index = latest.index + 1 if latest else 0
        resume_from = latest.checkpoint if latest else self.plan.resume_from
        slots = cluster.select_workers(
            client,
            self.plan.scaling,
            self.plan.dask_config.worker_timeout_s,
            frozenset(self.unresponsive),
            poll=InterruptWatch.check,
            allowed=self.plan.lease.allowed if self.plan.lease else None,
        )
        self._check_datasets(client, len(slots))
        self._announce(slots, resume_from)
        watchdog = ProgressWatchdog(self.plan.run_config.failure_config.hang_timeout_s, slots)
        self.collector.start_attempt(len(slots), start_index, watchdog)
        build = functools.partial(self._rank_launch, start_index, resume_from, slots)
        resources = dict(self.plan.scaling.resources_per_worker or {}) or None
        group: WorkerGroup | None = None
        try:
            with WorkerGroup.start(client, slots, build, resources) as group:
                self.collector.reply_with(group.send_to)
                yield group, watchdog
        finally:  # also when the run stops by raising (a pruned trial, Ctrl-C)
            if group is not None:  # known once the group was stopped
                self.unresponsive |= group.unresponsive_workers
                if self.plan.lease is not None:
                    self.plan.lease.withhold(group.unresponsive_workers)

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

    def _announce(self, slots: list[WorkerSlot], resume_from: Checkpoint | None) -> None:
        """Tell the callbacks (first attempt) and the log that a group of this size forms."""
        if not self.started:
            self.started = True
            found = self.manager.latest
            resumed = Report(found.index, found.metrics, found.checkpoint) if found else None
            info = RunInfo(self.name, self.storage.run_dir, len(slots), resumed)
            for callback in self.plan.run_config.callbacks:
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

    def _collective_timeout_s(self) -> int:
        """TorchConfig's timeout, capped so a collective never outwaits the hang watchdog."""
        hang = self.plan.run_config.failure_config.hang_timeout_s
        if hang is None:
            return self.plan.torch_config.timeout_s
        return min(self.plan.torch_config.timeout_s, max(1, math.ceil(2 * hang)))

    def _rank_launch(
        self,
        start_index: int,
        resume_from: Checkpoint | None,
        slots: list[WorkerSlot],
        slot: WorkerSlot,
        master_addr: str,
        master_port: int,
    ) -> RankLaunch:
        plan = self.plan
        world_size = len(slots)
        spec = RankSpec(
            world_rank=slot.world_rank,
            local_rank=slot.local_rank,
            node_rank=slot.node_rank,
            world_size=world_size,
            local_world_size=slot.local_world_size,
            host=slot.host,
            backend=backend.choose_backend(plan.torch_config, plan.scaling.use_gpu),
            timeout_s=self._collective_timeout_s(),
            use_gpu=plan.scaling.use_gpu,
            run_name=self.name,
            storage=self.storage,
            start_index=start_index,
            latest_checkpoint=resume_from,
            train_func_payload=plan.train_func_payload,
            dataset_names=tuple(source.name for source in plan.datasets),
            setup_payload=self.setup_payload,
            data_cache=self._cache_plans(slot.world_rank),
        )
        environment = backend.rank_environment(
            world_rank=slot.world_rank,
            local_rank=slot.local_rank,
            node_rank=slot.node_rank,
            world_size=world_size,
            local_world_size=slot.local_world_size,
            master_addr=master_addr,
            master_port=master_port,
        )
        return RankLaunch(
            world_rank=slot.world_rank,
            host=slot.host,
            local_rank=slot.local_rank,
            local_world_size=slot.local_world_size,
            use_gpu=plan.scaling.use_gpu,
            torch_environment=environment,
            sys_path=tuple(sys.path),
            spec_payload=cloudpickle.dumps(spec),
            feed=self._feed_plan(slots, slot, start_index),
            device=slot.device,
        )

    def _cache_plans(self, world_rank: int) -> dict[str, CachePlan]:
        plans = {
            source.name: self.plan.data_config.cache_plan(source.split, world_rank)
            for source in self.plan.datasets
        }
        return {name: plan for name, plan in plans.items() if plan is not None}

    def _feed_plan(
        self, slots: list[WorkerSlot], slot: WorkerSlot, start_index: int
    ) -> FeedPlan | None:
        if not self.plan.datasets:
            return None
        from trainlib._internal.worker.feeder import FeedPlan

        return FeedPlan(
            sources=self.plan.datasets,
            world_rank=slot.world_rank,
            worker_addresses=tuple(s.address for s in slots),
            shuffle_seed=self.plan.data_config.shuffle_seed,
            attempt_key=start_index,
        )
