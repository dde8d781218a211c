"""``ray.train.v2.torch.torch_trainer``."""

from trainlib.torch import TorchTrainer

__all__ = ["TorchTrainer"]
