"""TorchTrainer: runs a training function on every rank of a Dask-hosted process group."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import cloudpickle

from trainlib._internal import backend
from trainlib._internal.checkpoint_manager import CheckpointManager
from trainlib._internal.messages import RankSpec
from trainlib._internal.reports import ReportCollector
from trainlib._internal.storage import RunStorage
from trainlib._internal.watchdog import ProgressWatchdog
from trainlib.callbacks import Report, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import DaskConfig, RunConfig, ScalingConfig, TorchConfig
from trainlib.errors import ConfigError, RankFailure, WorkerGroupError
from trainlib.result import Result

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.ranks import WorkerSlot

logger = logging.getLogger(__name__)


class TorchTrainer:
    """Runs ``train_loop_per_worker`` on ``num_workers`` ranks with torch.distributed set up.

    Each rank is a process started next to one Dask worker (see ``DaskConfig``). Ranks join a
    gloo (CPU) or NCCL (GPU) process group before the function starts.

    Args:
        train_loop_per_worker: The function every rank runs; takes no argument or one
            (``train_loop_config``).
        train_loop_config: Passed to the function (``{}`` if omitted and it takes one).
        scaling_config: Number of ranks and their resources.
        run_config: Name, storage, checkpoint retention, failure handling, callbacks.
        torch_config: Process-group backend and timeout.
        dask_config: Which Dask cluster to use; a new LocalCluster by default.
        client: A connected ``distributed.Client`` to use instead of ``dask_config``.
        resume_from_checkpoint: Checkpoint for ``get_checkpoint()`` when the run directory
            has none of its own yet.

    Example:
        >>> trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))
        >>> result = trainer.fit()
        >>> result.metrics["loss"]
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:
        self._train_func = _bind_config(train_loop_per_worker, train_loop_config)
        self._scaling = scaling_config or ScalingConfig()
        self._run_config = run_config or RunConfig()
        self._torch = torch_config or TorchConfig()
        self._dask = dask_config or DaskConfig()
        self._client = client
        self._resume_from = resume_from_checkpoint

    def fit(self) -> Result:
        """Run training to the end and return its Result.

        Raises:
            WorkerGroupError: A rank failed more often than ``FailureConfig.max_failures``.
            NotEnoughWorkersError: The cluster cannot provide ``num_workers`` workers.
        """
        from trainlib._internal import cluster  # imported on use: rank processes never need Dask

        config = self._run_config
        name = config.name or datetime.now(timezone.utc).strftime("TorchTrainer_%Y-%m-%d_%H-%M-%S")
        storage = RunStorage.create(config.storage_path, name, config.storage_filesystem)
        manager = CheckpointManager.from_storage(config.checkpoint_config, storage)
        collector = ReportCollector(storage, manager, config.callbacks)
        found = manager.latest
        resumed = Report(found.index, found.metrics, found.checkpoint) if found else None
        for callback in config.callbacks:
            world_size = self._scaling.worker_range[1]
            callback.on_start(RunInfo(name, storage.run_dir, world_size, resumed))
        error: BaseException | None = None
        failures: list[RankFailure] = []
        try:
            with cluster.connect(self._dask, self._scaling, self._client) as client:
                self._run_attempts(client, name, storage, manager, collector, failures)
        except BaseException as exc:
            error = exc
        latest = manager.latest
        result = Result(
            metrics=collector.history[-1] if collector.history else {},
            checkpoint=latest.checkpoint if latest else None,
            best_checkpoints=manager.kept,
            path=storage.run_dir,
            filesystem=storage.filesystem,
            error=error,
            metrics_history=collector.history,
            failures=failures,
        )
        for callback in config.callbacks:
            callback.on_end(result)
        if error is not None:
            first_line = next(iter(str(error).splitlines()), "")
            logger.error("Run %s errored: %s %s", name, type(error).__name__, first_line)
            raise error
        logger.info("Run %s finished", name)
        return result

    def _run_attempts(
        self,
        client: Client,
        name: str,
        storage: RunStorage,
        manager: CheckpointManager,
        collector: ReportCollector,
        failures: list[RankFailure],
    ) -> None:
        """Attempts until one succeeds or ``max_failures`` is used up; ``failures`` gets the
        root cause of each failed attempt."""
        from trainlib._internal import cluster
        from trainlib._internal.worker_group import WorkerGroup

        failure_config = self._run_config.failure_config
        unresponsive: set[str] = set()
        while True:
            storage.remove_uncommitted()
            latest = manager.latest_intact()
            start_index = latest.index + 1 if latest else 0
            resume_from = latest.checkpoint if latest else self._resume_from
            logger.info(
                "Run %s starting (attempt %d) from %s",
                name,
                len(failures) + 1,
                resume_from or "scratch",
            )
            slots = cluster.select_workers(
                client, self._scaling, self._dask.worker_timeout_s, frozenset(unresponsive)
            )
            watchdog = ProgressWatchdog(failure_config.hang_timeout_s, slots)
            collector.start_attempt(len(slots), start_index, watchdog)
            build = functools.partial(
                self._rank_spec, name, storage, start_index, resume_from, len(slots)
            )
            resources = dict(self._scaling.resources_per_worker or {}) or None
            with WorkerGroup.start(client, slots, build, resources) as group:
                logger.info("Run %s running on %d ranks", name, len(slots))
                attempt_failures = group.run(collector.handle, watchdog.check)
            unresponsive |= group.unresponsive_workers
            if not attempt_failures:
                collector.check_all_complete()
                return
            error = WorkerGroupError(attempt_failures, num_restarts=len(failures))
            failures.append(error.root_cause)
            if failure_config.max_failures != -1 and len(failures) > failure_config.max_failures:
                raise error
            logger.warning(
                "Run %s restarting after failure %d: %s",
                name,
                len(failures),
                error.root_cause.one_line(),
            )

    def _collective_timeout_s(self) -> int:
        """TorchConfig's timeout, capped so a collective never outwaits the hang watchdog."""
        hang = self._run_config.failure_config.hang_timeout_s
        if hang is None:
            return self._torch.timeout_s
        return min(self._torch.timeout_s, max(1, math.ceil(2 * hang)))

    def _rank_spec(
        self,
        name: str,
        storage: RunStorage,
        start_index: int,
        resume_from: Checkpoint | None,
        world_size: int,
        slot: WorkerSlot,
        master_addr: str,
        master_port: int,
    ) -> RankSpec:
        return RankSpec(
            world_rank=slot.world_rank,
            local_rank=slot.local_rank,
            node_rank=slot.node_rank,
            world_size=world_size,
            local_world_size=slot.local_world_size,
            host=slot.host,
            master_addr=master_addr,
            master_port=master_port,
            backend=backend.choose_backend(self._torch, self._scaling.use_gpu),
            timeout_s=self._collective_timeout_s(),
            use_gpu=self._scaling.use_gpu,
            run_name=name,
            storage=storage,
            start_index=start_index,
            latest_checkpoint=resume_from,
            train_func_payload=self._train_func,
            sys_path=tuple(sys.path),
        )


def _bind_config(func: Callable[..., Any], config: dict[str, Any] | None) -> bytes:
    """Pickle ``func`` as a no-argument callable, with ``config`` bound if it takes one."""
    if not callable(func):
        raise ConfigError(f"train_loop_per_worker must be a function, got {func!r}.")
    required = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise ConfigError(
            f"train_loop_per_worker {func.__name__} takes {len(required)} arguments; "
            "it must take none or one (the train_loop_config dict)."
        )
    if not required and config is not None:
        raise ConfigError(
            f"train_loop_config was given but {func.__name__} takes no argument; "
            "add a config parameter or drop train_loop_config."
        )
    bound = functools.partial(func, dict(config or {})) if required else func
    return cloudpickle.dumps(bound)
