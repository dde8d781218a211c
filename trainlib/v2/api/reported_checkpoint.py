"""``ray.train.v2.api.reported_checkpoint``."""

from trainlib import ReportedCheckpoint, ReportedCheckpointStatus

__all__ = ["ReportedCheckpoint", "ReportedCheckpointStatus"]
