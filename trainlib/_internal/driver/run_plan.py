"""What a run needs (``RunPlan``, as a front end resolved it), and what each of its ranks is
launched with (``rank_launch``): the ``RankSpec`` it runs, torchrun's variables, its feed."""

from __future__ import annotations

import math
import socket
import sys
import threading
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import cloudpickle

from trainlib._internal.common.messages import CachePlan, FeedPlan, RankLaunch, RankSpec
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.ranks import device_index
from trainlib.checkpoint import Checkpoint
from trainlib.config import RunConfig, ScalingConfig
from trainlib.data_config import DataConfig
from trainlib.logging_config import LoggingConfig
from trainlib.torch_config import TorchConfig
from trainlib.validation import ValidationConfig

if TYPE_CHECKING:
    from trainlib._internal.common.datasets import DatasetSource
    from trainlib._internal.driver.ranks import WorkerSlot


class ClusterOptions(Protocol):
    """Which Dask cluster runs the ranks: what the engine reads of ``trainlib.DaskConfig``."""

    @property
    def address(self) -> str | None: ...

    @property
    def cluster_class(self) -> str | None: ...

    @property
    def cluster_kwargs(self) -> Mapping[str, Any]: ...

    @property
    def adapt_kwargs(self) -> Mapping[str, Any] | None: ...

    @property
    def worker_timeout_s(self) -> float: ...

    @property
    def driver_timeout_s(self) -> float | None: ...


class WorkerLease(Protocol):
    """The workers a run may choose its ranks from (a Tuner trial's share of the cluster)."""

    def allowed(self, eligible: Collection[str]) -> Collection[str]:
        """Of the eligible workers, those the run may use now."""
        ...

    def withhold(self, addresses: Collection[str]) -> None:
        """Never lend these workers again: a rank on them did not stop when asked."""
        ...


@dataclass(frozen=True)
class RunPlan:
    """Everything one run needs, as its front end resolved it."""

    train_func_payload: bytes
    scaling: ScalingConfig
    run_config: RunConfig
    torch_config: TorchConfig
    dask_config: ClusterOptions
    resume_from: Checkpoint | None = None
    datasets: tuple[DatasetSource, ...] = ()
    data_config: DataConfig = field(default_factory=DataConfig)
    default_name_prefix: str = "TorchTrainer"
    lease: WorkerLease | None = None  # a Tuner trial: select ranks only among its workers
    cancel: threading.Event | None = None  # a Tuner trial: set when its search stops
    validation: ValidationConfig | None = None  # validates the checkpoints reports ask for


@dataclass(frozen=True)
class AttemptStart:
    """Where one attempt of a run starts: the same for each of its ranks."""

    plan: RunPlan
    run_name: str
    storage: RunStorage
    start_index: int
    resume_from: Checkpoint | None
    slots: list[WorkerSlot]
    setup_payload: bytes | None  # ScalingConfig.worker_setup, pickled once per run


def choose_backend(config: TorchConfig, use_gpu: bool) -> Literal["gloo", "nccl"]:
    """NCCL with GPUs, gloo otherwise, unless the config names one."""
    if config.backend is not None:
        return config.backend
    return "nccl" if use_gpu else "gloo"


def find_free_port() -> int:
    """A TCP port that is free on this host now (run on rank 0's Dask worker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rank_environment(
    *,
    world_rank: int,
    local_rank: int,
    node_rank: int,
    world_size: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The torchrun-compatible variables a rank process gets (``env://`` rendezvous)."""
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(world_rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(node_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
    }


def collective_timeout_s(plan: RunPlan) -> int:
    """TorchConfig's timeout, capped so a collective never outwaits the hang watchdog."""
    hang = plan.run_config.failure_config.hang_timeout_s
    if hang is None:
        return plan.torch_config.timeout_s
    return min(plan.torch_config.timeout_s, max(1, math.ceil(2 * hang)))


def rank_launch(
    attempt: AttemptStart, slot: WorkerSlot, master_addr: str, master_port: int
) -> RankLaunch:
    """What the supervisor of ``slot``'s rank starts it with."""
    plan = attempt.plan
    world_size = len(attempt.slots)
    spec = RankSpec(
        world_rank=slot.world_rank,
        local_rank=slot.local_rank,
        node_rank=slot.node_rank,
        world_size=world_size,
        local_world_size=slot.local_world_size,
        host=slot.host,
        backend=choose_backend(plan.torch_config, plan.scaling.use_gpu),
        timeout_s=collective_timeout_s(plan),
        use_gpu=plan.scaling.use_gpu,
        run_name=attempt.run_name,
        storage=attempt.storage,
        start_index=attempt.start_index,
        latest_checkpoint=attempt.resume_from,
        train_func_payload=plan.train_func_payload,
        dataset_names=tuple(source.name for source in plan.datasets),
        setup_payload=attempt.setup_payload,
        data_cache=cache_plans(plan.data_config, plan.datasets, slot.world_rank),
        device_index=device_index(slot),
        log_level=(plan.run_config.logging_config or LoggingConfig()).level,
    )
    environment = rank_environment(
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
        feed=_feed_plan(attempt, slot),
        visible_devices=slot.visible_devices,
        device_hold=slot.device_hold,
        driver_timeout_s=plan.dask_config.driver_timeout_s,
    )


def cache_plans(
    config: DataConfig, datasets: Sequence[DatasetSource], world_rank: int
) -> dict[str, CachePlan]:
    """What rank ``world_rank`` needs to cache each dataset (none when not caching)."""
    if config.cache_shards == "off":
        return {}
    return {
        source.name: CachePlan(
            location=config.cache_shards,
            budget_bytes=config.cache_budget_bytes,
            shuffle=source.split and config.shuffle_seed is not None,
            seed=zlib.crc32(f"{config.shuffle_seed}:{world_rank}".encode()),
            world_rank=world_rank,
        )
        for source in datasets
    }


def _feed_plan(attempt: AttemptStart, slot: WorkerSlot) -> FeedPlan | None:
    plan = attempt.plan
    if not plan.datasets:
        return None
    return FeedPlan(
        sources=plan.datasets,
        world_rank=slot.world_rank,
        worker_addresses=tuple(s.address for s in attempt.slots),
        shuffle_seed=plan.data_config.shuffle_seed,
        attempt_key=attempt.start_index,
    )
