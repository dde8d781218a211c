"""``ray.train.v2.torch``."""

from trainlib.torch import (
    TorchConfig,
    TorchTrainer,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)

__all__ = [
    "TorchConfig",
    "TorchTrainer",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
]
