"""The training checkpoint file: what a rank saves each epoch and the registry loads.

One file, ``checkpoint.pt``, in a trainlib checkpoint directory: the classifier's weights and
what rebuilds it (model name, normalisation), the optimiser, scheduler and fp16 loss-scaler
states, the epoch, and the hyper-parameters. Loaded with ``torch.load(...,
weights_only=True)``: plain tensors and Python values only, never pickled code.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from cifar.classifier_file import classifier_from, spec_values
from cifar.models import Classifier, ModelSpec
from trainlib import Checkpoint

CHECKPOINT_FILE = "checkpoint.pt"


def save_training_state(
    directory: str,
    *,
    model: nn.Module,
    spec: ModelSpec,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    epoch: int,
    hyperparameters: dict[str, Any],
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """Write ``checkpoint.pt`` into ``directory`` (the unwrapped model's weights)."""
    torch.save(
        {
            "model": model.state_dict(),
            "model_spec": spec_values(spec),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            # fp16's loss scale ({} when the scaler is off): a resumed run keeps it instead of
            # skipping steps to find it again
            "scaler": scaler.state_dict() if scaler is not None else {},
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


def restore_training_state(
    directory: str,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
) -> int:
    """Load ``checkpoint.pt`` from ``directory`` into the training objects; the next epoch.

    The loss scale is restored only where both runs use one (fp16 on both GPUs).
    """
    state = load_training_state(directory)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler") and scaler.is_enabled():  # absent in checkpoints before it was kept
        scaler.load_state_dict(state["scaler"])
    return int(state["epoch"]) + 1


def load_classifier(checkpoint_uri: str) -> Classifier:
    """The classifier saved in the training checkpoint at ``checkpoint_uri``, in eval mode."""
    with Checkpoint(checkpoint_uri).as_directory() as directory:
        return classifier_from(load_training_state(directory))


def checkpoint_epoch(checkpoint_uri: str) -> int:
    """The epoch after which the training checkpoint at ``checkpoint_uri`` was saved."""
    with Checkpoint(checkpoint_uri).as_directory() as directory:
        return int(load_training_state(directory)["epoch"])
