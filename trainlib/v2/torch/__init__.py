"""``ray.train.v2.torch``."""

from trainlib.torch import (
    TorchConfig,
    TorchTrainer,
    backward,
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
    prepare_optimizer,
)

__all__ = [
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
