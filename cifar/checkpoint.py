"""The training checkpoint file: what a rank saves each epoch and the registry loads.

One file, ``checkpoint.pt``, in a trainlib checkpoint directory: the classifier's weights and
what rebuilds it (model name, normalisation), the optimiser and scheduler states, the epoch,
and the hyper-parameters. Loaded with ``torch.load(..., weights_only=True)``: plain tensors and
Python values only, never pickled code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cifar.models import Classifier, build_model
from trainlib import Checkpoint

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class ModelSpec:
    """What rebuilds a classifier around saved weights."""

    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def build(self) -> Classifier:
        """A new classifier of this kind (random weights)."""
        return build_model(self.name, self.mean, self.std)


def save_training_state(
    directory: str,
    *,
    model: nn.Module,
    spec: ModelSpec,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    epoch: int,
    hyperparameters: dict[str, Any],
) -> None:
    """Write ``checkpoint.pt`` into ``directory`` (the unwrapped model's weights)."""
    torch.save(
        {
            "model": model.state_dict(),
            "model_spec": {"name": spec.name, "mean": list(spec.mean), "std": list(spec.std)},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
            "hyperparameters": hyperparameters,
        },
        os.path.join(directory, CHECKPOINT_FILE),
    )


def load_training_state(directory: str) -> dict[str, Any]:
    """The contents of ``checkpoint.pt`` in ``directory``, tensors on the CPU."""
    state: dict[str, Any] = torch.load(
        os.path.join(directory, CHECKPOINT_FILE), weights_only=True, map_location="cpu"
    )
    return state


def load_classifier(checkpoint_uri: str) -> Classifier:
    """The classifier saved in the training checkpoint at ``checkpoint_uri``, in eval mode."""
    with Checkpoint(checkpoint_uri).as_directory() as directory:
        state = load_training_state(directory)
    spec = state["model_spec"]
    model = ModelSpec(spec["name"], tuple(spec["mean"]), tuple(spec["std"])).build()
    model.load_state_dict(state["model"])
    return model.eval()
