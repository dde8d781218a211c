"""``ray.air.config``'s names (Ray AIR's module of configs): trainlib's own."""

from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

__all__ = ["CheckpointConfig", "FailureConfig", "RunConfig", "ScalingConfig"]
