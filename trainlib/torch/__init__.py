"""PyTorch entry points, as in ``ray.train.torch``."""

from trainlib.config import ScalingConfig
from trainlib.torch.train_loop import (
    backward,
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
    prepare_optimizer,
)
from trainlib.torch.trainer import TorchTrainer
from trainlib.torch_config import TorchConfig

__all__ = [
    "ScalingConfig",
    "TorchConfig",
    "TorchTrainer",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]
