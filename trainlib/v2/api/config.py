"""``ray.train.v2.api.config``."""

from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.logging_config import LoggingConfig

__all__ = ["CheckpointConfig", "FailureConfig", "LoggingConfig", "RunConfig", "ScalingConfig"]
