"""``ray.train.v2.api.report_config``."""

from trainlib import CheckpointConsistencyMode, CheckpointUploadMode

__all__ = ["CheckpointConsistencyMode", "CheckpointUploadMode"]
