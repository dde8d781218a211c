"""``ray.train.v2.api.data_parallel_trainer``."""

from trainlib.data_parallel_trainer import DataParallelTrainer

__all__ = ["DataParallelTrainer"]
