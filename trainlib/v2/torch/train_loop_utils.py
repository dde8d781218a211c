"""``ray.train.v2.torch.train_loop_utils``."""

from trainlib.torch import get_device, get_devices, prepare_data_loader, prepare_model

__all__ = ["get_device", "get_devices", "prepare_data_loader", "prepare_model"]
