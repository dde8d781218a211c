"""The per-rank CIFAR training loop that ``TorchTrainer`` runs on every rank.

A rank process imports only what training needs: torch, trainlib, the model code and the data
iterator (no Prefect, no MLflow; torchvision only for the models built from it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

import trainlib
from tasks.augment import augment
from tasks.errors import InvalidParameterError, TrainingDivergedError
from tasks.model_checkpoint import ModelSpec, load_training_state, save_training_state
from tasks.models import check_model_name
from trainlib import Checkpoint
from trainlib.torch import get_device, prepare_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (logged to MLflow as params)."""

    model: str = "small_cnn"
    epochs: int = 5
    batch_size: int = 256
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    use_gpu: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_model_name(self.model)
        if self.epochs < 1 or self.batch_size < 1 or not 0 <= self.lr < math.inf:
            raise InvalidParameterError(
                f"epochs={self.epochs} and batch_size={self.batch_size} must be at least 1 and "
                f"lr={self.lr} a finite number >= 0."
            )


def loop_config(config: TrainConfig, spec: ModelSpec, train_rows: int) -> dict[str, Any]:
    """What every rank gets as ``train_loop_config``: plain data."""
    return {"hyperparameters": asdict(config), "model_spec": asdict(spec), "train_rows": train_rows}


def cifar_train_func(loop: dict[str, Any]) -> None:
    """Trains on this rank's share of ``train``, evaluates on ``val``, reports every epoch."""
    config = TrainConfig(**loop["hyperparameters"])
    # The model named by the hyperparameters (a search may choose it), normalised as the dataset.
    spec = ModelSpec(**{**loop["model_spec"], "name": config.model})
    world_size = trainlib.get_context().get_world_size()
    per_rank_batch = max(1, config.batch_size // world_size)
    steps = (loop["train_rows"] // world_size) // per_rank_batch
    torch.manual_seed(config.seed)
    classifier = spec.build()
    if config.use_gpu:
        classifier = classifier.to(memory_format=torch.channels_last)
    model = prepare_model(classifier)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        nesterov=config.momentum > 0,
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=max(config.lr, 1e-12), total_steps=config.epochs * steps
    )
    start_epoch = _resume(classifier, optimizer, scheduler)
    train, val = trainlib.get_dataset_shard("train"), trainlib.get_dataset_shard("val")
    for epoch in range(start_epoch, config.epochs):
        began = time.perf_counter()
        batches = train.iter_torch_batches(
            batch_size=per_rank_batch,
            drop_last=True,  # equal shares: every rank takes the same number of steps
            local_shuffle_buffer_size=4 * per_rank_batch,
            local_shuffle_seed=config.seed * 1000 + epoch,
        )
        train_loss, train_accuracy = _train_epoch(
            model, batches, optimizer, scheduler, config, epoch
        )
        val_loss, val_accuracy = _evaluate(model, val.iter_torch_batches(batch_size=1024), config)
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss,
            "train_accuracy": train_accuracy,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "epoch_time_s": time.perf_counter() - began,
        }
        _log_epoch(metrics, config.epochs)
        with tempfile.TemporaryDirectory() as directory:
            if trainlib.get_context().get_world_rank() == 0:
                save_training_state(
                    directory,
                    model=classifier,
                    spec=spec,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    epoch=epoch,
                    hyperparameters=asdict(config),
                )
            trainlib.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _train_epoch(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config: TrainConfig,
    epoch: int,
) -> tuple[float, float]:
    """One pass; stops with TrainingDivergedError at the first non-finite loss."""
    model.train()
    loss_sum = correct = seen = 0.0
    for step, batch in enumerate(batches):
        images, labels = augment(batch["image"]), batch["label"]
        with _autocast(config):
            logits = model(images)
        loss = nn.functional.cross_entropy(logits.float(), labels)
        value = loss.item()
        if not math.isfinite(value):
            raise TrainingDivergedError(
                f"The training loss became {value} at epoch {epoch + 1}, step {step + 1} "
                f"(lr={config.lr:g}): training diverged, and nothing was registered. Lower the "
                f"learning rate (e.g. lr={config.lr / 10:g})."
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_sum += value * len(labels)
        correct += (logits.argmax(1) == labels).sum().item()
        seen += len(labels)
    loss_sum, correct, seen = _sum_across_ranks([loss_sum, correct, seen])
    return loss_sum / seen, correct / seen


def _evaluate(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], config: TrainConfig
) -> tuple[float, float]:
    """Loss and accuracy over every rank's share of the validation set."""
    model.eval()
    loss_sum = correct = seen = 0.0
    with torch.no_grad():
        for batch in batches:
            images, labels = batch["image"], batch["label"]
            with _autocast(config):
                logits = model(images)
            loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
    loss_sum, correct, seen = _sum_across_ranks([loss_sum, correct, seen])
    return loss_sum / seen, correct / seen


def _sum_across_ranks(values: Sequence[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=get_device())
    torch.distributed.all_reduce(tensor)
    return [float(v) for v in tensor.tolist()]


def _autocast(config: TrainConfig) -> contextlib.AbstractContextManager[Any]:
    if config.use_gpu:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _resume(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> int:
    """Load the latest checkpoint if there is one; return the first epoch to train."""
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        state = load_training_state(directory)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["epoch"]) + 1


def _log_epoch(metrics: dict[str, Any], epochs: int) -> None:
    rank = trainlib.get_context().get_world_rank()
    logger.log(
        logging.INFO if rank == 0 else logging.DEBUG,
        "epoch %d/%d: train loss %.4f, val accuracy %.4f, %.1f s",
        metrics["epoch"] + 1,
        epochs,
        metrics["train_loss"],
        metrics["val_accuracy"],
        metrics["epoch_time_s"],
    )
