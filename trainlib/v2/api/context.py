"""``ray.train.v2.api.context``."""

from trainlib.context import TrainContext

__all__ = ["TrainContext"]
