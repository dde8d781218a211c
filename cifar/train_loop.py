"""The per-rank CIFAR training loop that ``TorchTrainer`` runs on every rank.

A rank process imports only what training needs: torch, trainlib, the model code and the data
iterator (no Prefect, no MLflow; torchvision only for the models built from it).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

import trainlib
from cifar.augment import augment, augmentation_generator
from cifar.checkpoint import restore_training_state, save_training_state
from cifar.dataset import per_rank_batch_size
from cifar.errors import InvalidParameterError, TrainingDivergedError
from cifar.gpu_settings import (
    autocast,
    autocast_dtype,
    compiled_graphs,
    model_inputs,
    took_effect,
)
from cifar.model_names import check_model_name
from cifar.models import ModelSpec
from trainlib import Checkpoint
from trainlib.torch import prepare_model

logger = logging.getLogger(__name__)

CHECK_EVERY_STEPS = 50  # how often a training pass looks for a non-finite loss


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
    compile: bool = False  # torch.compile the model (see docs/benchmarks.md: when it pays)

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
    per_rank_batch = per_rank_batch_size(config.batch_size, world_size)
    steps = (loop["train_rows"] // world_size) // per_rank_batch
    torch.manual_seed(config.seed)
    classifier = spec.build()
    if config.use_gpu:
        classifier = classifier.to(memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = True  # every batch is 32x32: tune convolutions once
    model = prepare_model(classifier)
    if config.compile:
        model = torch.compile(model)  # type: ignore[assignment]  # checkpoints keep `classifier`
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
    # fp16's loss scale, kept across epochs (a new scaler would skip steps to find it again)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast_dtype(config.use_gpu) is torch.float16)
    start_epoch = _resume(classifier, optimizer, scheduler, scaler)
    settings = took_effect(classifier, config.use_gpu)
    train, val = trainlib.get_dataset_shard("train"), trainlib.get_dataset_shard("val")
    for epoch in range(start_epoch, config.epochs):
        began = time.perf_counter()
        batches = train.iter_torch_batches(
            batch_size=per_rank_batch,
            drop_last=True,  # equal shares: every rank takes the same number of steps
            local_shuffle_buffer_size=4 * per_rank_batch,
            local_shuffle_seed=config.seed * 1000 + epoch,
        )
        rank = trainlib.get_context().get_world_rank()
        augmentation = augmentation_generator(config.seed, rank, epoch, _device(model))
        train_loss, train_accuracy = _train_epoch(
            model, batches, optimizer, scheduler, scaler, config, epoch, augmentation
        )
        val_loss, val_accuracy = _evaluate(model, val.iter_torch_batches(batch_size=1024), config)
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss,
            "train_accuracy": train_accuracy,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "epoch_time_s": time.perf_counter() - began,
            **settings,
            "compiled_graphs": compiled_graphs() if config.compile else 0.0,
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
                    scaler=scaler,
                )
            trainlib.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _train_epoch(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    config: TrainConfig,
    epoch: int,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """One pass, augmenting with ``generator``'s stream; stops with TrainingDivergedError once
    the loss is found non-finite.

    Sums stay on the device: the host waits for the device only every ``CHECK_EVERY_STEPS``
    steps (to look for a non-finite loss) and at the end, never at each step.
    """
    model.train()
    dtype = autocast_dtype(config.use_gpu)
    totals = torch.zeros(3, dtype=torch.float64, device=_device(model))  # loss, correct, seen
    checked = step = 0  # steps known to be finite, steps taken
    for step, batch in enumerate(batches, start=1):
        images, labels = (
            model_inputs(augment(batch["image"], generator), config.use_gpu),
            batch["label"],
        )
        with autocast(dtype):
            logits = model(images)
        loss = nn.functional.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if _stepped(scaler, optimizer):
            scheduler.step()
        totals += _batch_totals(loss.detach() * len(labels), logits, labels)
        if step % CHECK_EVERY_STEPS == 0:
            checked = _check_finite(totals, checked, step, config, epoch)
    _check_finite(totals, checked, step, config, epoch)
    loss_sum, correct, seen = _sum_across_ranks(totals)
    return loss_sum / seen, correct / seen


def _stepped(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Step ``optimizer``; False when fp16's GradScaler skipped the step (inf or NaN
    gradients while it finds its scale), so the schedule must not advance either.

    Only fp16 (GPUs without native bf16) reads the scale back, a wait for the device that
    ``GradScaler.step`` already makes at every step to check the gradients.
    """
    if not scaler.is_enabled():
        optimizer.step()
        return True
    scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() >= scale  # a skipped step backs the scale off


def _evaluate(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], config: TrainConfig
) -> tuple[float, float]:
    """Loss and accuracy over every rank's share of the validation set."""
    model.eval()
    dtype = autocast_dtype(config.use_gpu)
    totals = torch.zeros(3, dtype=torch.float64, device=_device(model))
    with torch.no_grad():
        for batch in batches:
            images, labels = model_inputs(batch["image"], config.use_gpu), batch["label"]
            with autocast(dtype):
                logits = model(images)
            batch_loss = nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
            totals += _batch_totals(batch_loss, logits, labels)
    loss_sum, correct, seen = _sum_across_ranks(totals)
    return loss_sum / seen, correct / seen


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _batch_totals(
    loss_sum: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """A batch's loss sum, correct count and size, as one device tensor (no host sync)."""
    correct = (logits.argmax(1) == labels).sum()
    seen = torch.full((), len(labels), device=labels.device)  # a fill, not a host copy
    return torch.stack([loss_sum.double(), correct.double(), seen.double()])


def _check_finite(
    totals: torch.Tensor, checked: int, steps: int, config: TrainConfig, epoch: int
) -> int:
    """Raise if a loss since step ``checked`` was not finite; else the steps now checked."""
    value = float(totals[0])  # waits for the device
    if not math.isfinite(value):
        where = f"step {steps}" if steps - checked <= 1 else f"steps {checked + 1}-{steps}"
        raise TrainingDivergedError(
            f"The training loss became {value} at epoch {epoch + 1}, {where} "
            f"(lr={config.lr:g}): training diverged, and nothing was registered. Lower the "
            f"learning rate (e.g. lr={config.lr / 10:g})."
        )
    return steps


def _sum_across_ranks(totals: torch.Tensor) -> list[float]:
    torch.distributed.all_reduce(totals)
    return [float(v) for v in totals.tolist()]


def _resume(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
) -> int:
    """Load the latest checkpoint if there is one; return the first epoch to train."""
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        return restore_training_state(
            directory, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )


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
