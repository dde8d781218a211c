"""Plain-data messages between the driver, the rank supervisors and the rank processes.

A rank sends ``RankMessage``s to its supervisor, which relays ``DriverMessage``s to the driver
and acts on the rest itself; the supervisor (and the driver, through it) sends a rank
``ToRank`` messages. Each is a frozen dataclass, told apart by its type.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from trainlib._internal.common.commit_marker import FileEntry
from trainlib._internal.common.storage import RunStorage
from trainlib.checkpoint import Checkpoint
from trainlib.errors import RankFailure
from trainlib.preemption import PreemptionInfo
from trainlib.validation import ReportedCheckpointStatus

if TYPE_CHECKING:  # a rank process never imports Dask
    from trainlib._internal.common.datasets import DatasetSource
    from trainlib.data_config import CacheLocation


@dataclass(frozen=True)
class CachePlan:
    """What a rank needs to cache one dataset's shard (``DataConfig.cache_shards``)."""

    location: CacheLocation
    budget_bytes: int
    shuffle: bool  # a split dataset with a shuffle seed: every pass gets another order
    seed: int
    world_rank: int = 0  # rank 0 logs what it keeps at INFO, the others at DEBUG


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank process needs to run the train function (loaded in the rank only)."""

    world_rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    host: str
    backend: Literal["gloo", "nccl"]
    timeout_s: int
    use_gpu: bool
    run_name: str
    storage: RunStorage
    start_index: int
    latest_checkpoint: Checkpoint | None
    train_func_payload: bytes
    dataset_names: tuple[str, ...] = ()
    setup_payload: bytes | None = None  # ScalingConfig.worker_setup, pickled
    data_cache: dict[str, CachePlan] = field(default_factory=dict)  # DataConfig.cache_shards
    device_index: int = 0  # with use_gpu: the rank's own CUDA device among those it sees
    log_level: int = logging.INFO  # RunConfig.logging_config: the trainlib logger's level


@dataclass(frozen=True)
class FeedPlan:
    """What a rank's feeder needs: the datasets, and where the group's ranks run."""

    sources: tuple[DatasetSource, ...]
    world_rank: int
    worker_addresses: tuple[str, ...]  # by world rank
    shuffle_seed: int | None
    attempt_key: int  # differs between attempts, so a restarted pass gets a new order


@dataclass(frozen=True)
class RankLaunch:
    """What a supervisor needs to start one rank.

    The ``RankSpec`` travels pickled (``spec_payload``): it may hold objects of the user's
    modules (a storage filesystem, say), which only the rank, with ``sys_path`` applied,
    needs to import.
    """

    world_rank: int
    host: str
    local_rank: int
    local_world_size: int
    use_gpu: bool
    torch_environment: dict[str, str]
    sys_path: tuple[str, ...]
    spec_payload: bytes
    feed: FeedPlan | None = None
    # with use_gpu: the CUDA_VISIBLE_DEVICES entries the rank sees (its own and its host's
    # other ranks' devices: NCCL uses a direct link only to a GPU it can see)
    visible_devices: tuple[str, ...] = ()
    device_hold: str | None = None  # with use_gpu: the name it holds its GPU by on its host
    driver_timeout_s: float | None = None  # DaskConfig's: stop once the driver is silent this long


@dataclass(frozen=True)
class ReportMessage:
    """One rank's ``report()`` call: rank 0 sends its metrics, every rank its uploaded files
    (and the ``checkpoint_dir_name`` they went under, if one was given). ``validation``: the
    validation function's keyword arguments this report asked for (None: no validation)."""

    world_rank: int
    index: int
    metrics: dict[str, Any] | None
    files: dict[str, FileEntry] | None
    dir_name: str | None = None
    validation: dict[str, Any] | None = None


@dataclass(frozen=True)
class CheckpointsQuery:
    """A rank asks for the run's committed checkpoints once the driver has processed every
    report before ``index`` (``get_all_reported_checkpoints``), relayed to the driver as the
    reports are, after them. ``validated``: also once the validations those reports asked for
    have ended."""

    world_rank: int
    index: int
    validated: bool = True


@dataclass(frozen=True)
class CheckpointsAnswer:
    """The driver's answer to a ``CheckpointsQuery``: the run's committed checkpoints, each
    with its metrics and its status (``get_all_reported_checkpoints``)."""

    checkpoints: list[tuple[Checkpoint, dict[str, Any], ReportedCheckpointStatus]]


@dataclass(frozen=True)
class PreemptionNotice:
    """The driver's notice to the ranks that some ranks' workers are being retired
    (``trainlib.get_preemption_info``)."""

    info: PreemptionInfo


# Variables a batch system sets in a job's processes (a Dask worker started by dask-jobqueue,
# and so its ranks), and how to name the job.
_BATCH_JOB_VARIABLES = (
    ("SLURM_JOB_ID", "SLURM job"),
    ("PBS_JOBID", "PBS job"),
    ("LSB_JOBID", "LSF job"),
)


@dataclass(frozen=True)
class RankStarted:
    """A rank joined the process group; where it runs, for the driver's log."""

    world_rank: int
    host: str
    pid: int
    batch_job: str = ""  # e.g. "SLURM job 12"; empty outside a batch system

    @classmethod
    def here(cls, world_rank: int, host: str) -> RankStarted:
        """This process, as rank ``world_rank`` on ``host``."""
        job = next(
            (
                f"{name} {os.environ[key]}"
                for key, name in _BATCH_JOB_VARIABLES
                if os.environ.get(key)
            ),
            "",
        )
        return cls(world_rank, host, os.getpid(), job)

    def describe(self) -> str:
        """``"rank 1 on 10.0.0.5 (pid 4242, SLURM job 12)"``."""
        job = f", {self.batch_job}" if self.batch_job else ""
        return f"rank {self.world_rank} on {self.host} (pid {self.pid}{job})"


@dataclass(frozen=True)
class RankLog:
    """A log record of rank 0, for the driver's handlers (already filtered by level)."""

    record: logging.LogRecord


@dataclass(frozen=True)
class RankDone:
    """The training function returned and its checkpoint uploads ended."""


@dataclass(frozen=True)
class DataRequest:
    """A rank asks its feeder for the next block of dataset ``dataset`` in pass ``pass_id``."""

    dataset: str
    pass_id: int


@dataclass(frozen=True)
class DataBlock:
    """The feeder's answer to a ``DataRequest``: the next block of the pass (None: the pass
    ended; a ``DatasetError``: reading it failed, which the rank raises)."""

    dataset: str
    pass_id: int
    block: Any


SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class RankStartup:
    """The first message a rank process receives, from its supervisor (made of the
    ``RankLaunch``): where it stands in the run, what to import from (``sys_path``, ``cwd``),
    its environment, and the pickled ``RankSpec`` (loaded last: it may reference the user's
    modules)."""

    world_rank: int
    host: str
    sys_path: tuple[str, ...]
    cwd: str
    environment: dict[str, str]
    spec_payload: bytes


# A worker's fork server (``rank.fork_server``): the worker sends a ``ForkRequest``; the server
# answers ``Forked`` and then passes the new rank's socket, and sends ``RankExited`` when that
# rank has ended.


@dataclass(frozen=True)
class ForkRequest:
    """Fork one more rank process."""


@dataclass(frozen=True)
class Forked:
    """The server forked ``pid``; the rank's end of its connection follows (``SCM_RIGHTS``)."""

    pid: int


@dataclass(frozen=True)
class RankExited:
    """Forked process ``pid`` ended with Popen's exit ``code`` (negative: the signal)."""

    pid: int
    code: int


@dataclass(frozen=True)
class Command:
    """A call on a live group (``trainlib.sgd``), sent to every rank: ``kind`` names it (the
    group's runner knows its kinds), ``payload`` is plain data.

    Every rank answers a command, except ``SHUTDOWN``, with exactly one ``report()``; on
    ``SHUTDOWN`` its loop returns and the rank ends as a finished training function does.
    """

    kind: str
    payload: Any = None


# What a rank says (a ``RankFailure``: it failed, then exits), what of it reaches the driver,
# and what a rank is sent.
DriverMessage: TypeAlias = RankStarted | ReportMessage | CheckpointsQuery | RankLog
RankMessage: TypeAlias = DriverMessage | RankFailure | RankDone | DataRequest
ToRank: TypeAlias = DataBlock | CheckpointsAnswer | PreemptionNotice | Command


def is_private(variable: str) -> bool:
    """A variable named with a leading underscore: a library's own state, not configuration.

    Such variables may differ between a worker's fork server and a rank's launch, which sets them as
    they are now. MLflow's telemetry sets ``_MLFLOW_TELEMETRY_SESSION_ID`` in the driver's
    environment and removes it again when its telemetry stops (offline: once its configuration
    cannot be fetched), which the workers of a LocalCluster (threads of the driver) see at any
    moment.
    """
    return variable.startswith("_")
