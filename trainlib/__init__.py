"""trainlib: Ray-Train-style distributed PyTorch training on a Dask cluster.

Port a Ray Train loop by changing imports: ``ray.train`` -> ``trainlib``,
``ray.train.torch`` -> ``trainlib.torch``.
"""

from trainlib import collective  # noqa: F401  (trainlib.collective, as ray.train.collective)
from trainlib.callbacks import (
    Callback,
    GroupInfo,
    RankPlacement,
    Report,
    RunInfo,
    TrackingCallback,
)
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.context import TrainContext, get_context
from trainlib.dask_config import DaskConfig
from trainlib.data import DataConfig, get_dataset_shard
from trainlib.errors import (
    CheckpointError,
    ClusterError,
    ConfigError,
    ControllerError,
    DatasetError,
    NotEnoughWorkersError,
    RankError,
    RankFailure,
    TrainingFailedError,
    TrainlibError,
    WorkerGroupError,
)
from trainlib.logging_config import LoggingConfig
from trainlib.preemption import PreemptionInfo
from trainlib.ray_hints import SyncConfig
from trainlib.reporting import (
    CheckpointUploadMode,
    ReportedCheckpoint,
    get_all_reported_checkpoints,
    get_checkpoint,
    get_preemption_info,
    report,
)
from trainlib.result import Result
from trainlib.torch_config import TorchConfig
from trainlib.user_callback import TrainRunContext, UserCallback
from trainlib.validation import (
    CheckpointConsistencyMode,
    ReportedCheckpointStatus,
    ValidationConfig,
    ValidationFn,
    ValidationTaskConfig,
)

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointError",
    "CheckpointUploadMode",
    "ClusterError",
    "ConfigError",
    "ControllerError",
    "DaskConfig",
    "DataConfig",
    "DatasetError",
    "FailureConfig",
    "GroupInfo",
    "LoggingConfig",
    "NotEnoughWorkersError",
    "PreemptionInfo",
    "RankError",
    "RankFailure",
    "RankPlacement",
    "Report",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "RunInfo",
    "ScalingConfig",
    "SyncConfig",
    "TorchConfig",
    "TrackingCallback",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "TrainlibError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
