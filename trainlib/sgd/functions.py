"""The default train and validation functions of PyTorchTrainer (one pass each).

Custom functions take the same arguments; they may call these for one model of several.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import nn

from trainlib._internal.rank.process_globals import RANK
from trainlib.sgd.precision import get_mixed_precision


def train_epoch(
    config: dict[str, Any],
    model: nn.Module,
    train_iterator: Iterable[Any],
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
) -> dict[str, Any]:
    """One pass over ``train_iterator`` of ``(features, target)`` batches.

    Steps ``scheduler`` after each batch or after the pass (``scheduler_step_freq``).
    Uses ``get_mixed_precision()`` (``use_fp16``).

    Returns:
        ``train_loss`` (mean over samples) and ``num_samples``.

    Raises:
        ValueError: Several models, optimizers or schedulers (give a ``train_function``), or
            no criterion (give a ``loss_creator``).
    """
    _check_single("train_function", model, optimizer, scheduler, criterion)
    precision = get_mixed_precision()
    model.train()
    total, count = 0.0, 0
    for features, target in train_iterator:
        with precision.autocast():
            output = model(features)
        loss = criterion(precision.to_float(output), target)
        optimizer.zero_grad()
        precision.backward(loss)
        stepped = precision.step(optimizer)
        if scheduler is not None and RANK.scheduler_step_freq == "batch" and stepped:
            scheduler.step()
        total += loss.item() * len(target)
        count += len(target)
    if scheduler is not None and RANK.scheduler_step_freq == "epoch":
        scheduler.step()
    return {"train_loss": total / count if count else math.nan, "num_samples": count}


def validate_epoch(
    config: dict[str, Any],
    model: nn.Module,
    val_iterator: Iterable[Any],
    criterion: nn.Module,
    scheduler: Any = None,
) -> dict[str, Any]:
    """One pass over ``val_iterator`` without gradients.

    Returns:
        ``validation_loss`` and ``num_samples``, plus ``mean_accuracy`` for a classifier
        (outputs of shape ``(batch, classes)`` and integer targets).
    """
    _check_single("validation_function", model, None, scheduler, criterion)
    precision = get_mixed_precision()
    model.eval()
    total, count, correct, is_classifier = 0.0, 0, 0, False
    with torch.no_grad():
        for features, target in val_iterator:
            with precision.autocast():
                output = model(features)
            loss = criterion(precision.to_float(output), target)
            total += loss.item() * len(target)
            count += len(target)
            if output.ndim == 2 and output.shape[1] > 1 and not target.is_floating_point():
                is_classifier = True
                correct += int((output.argmax(dim=1) == target).sum().item())
    stats: dict[str, Any] = {
        "validation_loss": total / count if count else math.nan,
        "num_samples": count,
    }
    if is_classifier:
        stats["mean_accuracy"] = correct / count
    return stats


def set_scheduler_step_freq(freq: Literal["batch", "epoch"]) -> None:
    """When the default train function steps the scheduler (set once per rank)."""
    RANK.scheduler_step_freq = freq


def _check_single(name: str, model: Any, optimizer: Any, scheduler: Any, criterion: Any) -> None:
    if any(isinstance(x, tuple) for x in (model, optimizer, scheduler)):
        raise ValueError(
            "The default functions train one model with one optimizer and scheduler; the "
            f"creators returned several: pass PyTorchTrainer({name}=...) to use them."
        )
    if criterion is None:
        raise ValueError(
            "The default functions need a loss: pass PyTorchTrainer(loss_creator=...), "
            "e.g. torch.nn.MSELoss."
        )
