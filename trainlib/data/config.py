"""DataConfig: how ``TorchTrainer(datasets=...)`` reaches the ranks (Ray Train's DataConfig;
defined with the engine that reads it, ``trainlib/_internal/common/data_config.py``)."""

from trainlib._internal.common.data_config import DataConfig

__all__ = ["DataConfig"]
