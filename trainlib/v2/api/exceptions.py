"""``ray.train.v2.api.exceptions``."""

from trainlib.errors import ControllerError, TrainingFailedError, WorkerGroupError

__all__ = ["ControllerError", "TrainingFailedError", "WorkerGroupError"]
