"""Image classifiers that take raw uint8 images: normalisation is part of the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cifar.model_names import check_model_name

NUM_CLASSES = 10


@dataclass(frozen=True)
class ModelSpec:
    """What rebuilds a classifier around saved weights."""

    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def build(self) -> Classifier:
        """A new classifier of this kind (random weights)."""
        return build_model(self.name, self.mean, self.std)


class Classifier(nn.Module):
    """Raw uint8 images (N, 3, 32, 32) in, class scores (N, 10) out; ``spec`` rebuilds it."""

    def __init__(self, backbone: nn.Module, spec: ModelSpec) -> None:
        super().__init__()
        self.backbone = backbone
        self.spec = spec
        self.register_buffer("mean", torch.tensor(spec.mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(spec.std, dtype=torch.float32).view(1, 3, 1, 1))

    mean: torch.Tensor
    std: torch.Tensor

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.mean.dtype) / 255.0
        return self.backbone((x - self.mean) / self.std)


def small_cnn() -> nn.Module:
    """A fast CNN for CPU runs (about 0.3 M parameters)."""

    def block(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        block(3, 32),
        block(32, 64),
        block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, NUM_CLASSES),
    )


def cifar_resnet18() -> nn.Module:
    """torchvision's resnet18 adapted to 32x32 images: 3x3 stem, stride 1, no max-pool."""
    import torchvision  # imported on use: a rank training small_cnn never loads it

    model = torchvision.models.resnet18(num_classes=NUM_CLASSES)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


BACKBONES: dict[str, Callable[[], nn.Module]] = {"small_cnn": small_cnn, "resnet18": cifar_resnet18}


def build_model(name: str, mean: Sequence[float], std: Sequence[float]) -> Classifier:
    """The classifier ``name`` with the dataset's normalisation built in."""
    check_model_name(name)
    spec = ModelSpec(name, (mean[0], mean[1], mean[2]), (std[0], std[1], std[2]))
    return Classifier(BACKBONES[name](), spec)
