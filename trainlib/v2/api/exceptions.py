"""``ray.train.v2.api.exceptions``."""

from trainlib.errors import TrainingFailedError, WorkerGroupError

__all__ = ["TrainingFailedError", "WorkerGroupError"]
