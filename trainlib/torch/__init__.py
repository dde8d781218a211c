"""PyTorch entry points, as in ``ray.train.torch``."""

from trainlib.config import ScalingConfig, TorchConfig
from trainlib.torch.train_loop import (
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)
from trainlib.torch.trainer import TorchTrainer

__all__ = [
    "ScalingConfig",
    "TorchConfig",
    "TorchTrainer",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
]
