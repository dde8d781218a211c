"""The training step: a trainlib train function over the dataset's shards, and its driver."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

import trainlib
from tasks.augment import augment
from tasks.models import build_model, check_model_name
from tasks.preprocess import Manifest, read_manifest, read_shard
from tasks.tracking import MLflowCallback, start_run
from trainlib import Checkpoint, CheckpointConfig, DaskConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer, get_device, prepare_model

CHECKPOINT_FILE = "checkpoint.pt"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters and data of one training run (logged to MLflow as params)."""

    dataset_uri: str
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
        if self.epochs < 1 or self.batch_size < 1 or self.lr < 0:
            raise ValueError(
                f"epochs={self.epochs} and batch_size={self.batch_size} must be >= 1 "
                f"and lr={self.lr} >= 0."
            )


@dataclass(frozen=True)
class TrainOutcome:
    """The best checkpoint (by val_accuracy) and the last reported metrics."""

    best_checkpoint_uri: str
    best_metrics: dict[str, Any]
    final_metrics: dict[str, Any]
    run_path: str


def _rank_shard_images(
    manifest: Manifest, dataset_uri: str, rank: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's own training shards (shard i goes to rank i mod world size)."""
    shards = manifest.splits["train"][rank::world_size]
    if not shards:
        raise ValueError(
            f"The dataset has {len(manifest.splits['train'])} training shards for "
            f"{world_size} ranks; preprocess with a smaller shard_size or use fewer workers."
        )
    batches = [read_shard(dataset_uri, s) for s in shards]
    images = torch.from_numpy(np.concatenate([b.images for b in batches]))
    labels = torch.from_numpy(np.concatenate([b.labels for b in batches]))
    return images, labels


def _steps_per_epoch(manifest: Manifest, world_size: int, per_rank_batch: int) -> int:
    """Steps every rank can take: DDP needs the same number of steps on all ranks."""
    shards = manifest.splits["train"]
    counts = [sum(s.count for s in shards[r::world_size]) for r in range(world_size)]
    return max(1, min(counts) // per_rank_batch)


def _sum_across_ranks(values: Sequence[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def _evaluate(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
    autocast: Any,
) -> tuple[float, float]:
    """Loss and accuracy over every rank's slice of the validation set."""
    model.eval()
    loss_sum = correct = 0.0
    with torch.no_grad():
        for start in range(0, len(labels), 1024):
            x, y = images[start : start + 1024].to(device), labels[start : start + 1024].to(device)
            with autocast():
                logits = model(x)
            loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    loss_sum, correct, total = _sum_across_ranks([loss_sum, correct, len(labels)], device)
    return loss_sum / total, correct / total


def cifar_train_func(config: dict[str, Any]) -> None:
    """Runs on every rank: trains on its own shards, reports and checkpoints every epoch."""
    cfg = TrainConfig(**config)
    context = trainlib.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = get_device()
    manifest = read_manifest(cfg.dataset_uri)
    images, labels = _rank_shard_images(manifest, cfg.dataset_uri, rank, world_size)
    val = [read_shard(cfg.dataset_uri, s) for s in manifest.splits["val"]]
    val_images = torch.from_numpy(np.concatenate([b.images for b in val]))[rank::world_size]
    val_labels = torch.from_numpy(np.concatenate([b.labels for b in val]))[rank::world_size]
    per_rank_batch = max(1, cfg.batch_size // world_size)
    steps = _steps_per_epoch(manifest, world_size, per_rank_batch)

    torch.manual_seed(cfg.seed)
    classifier = build_model(cfg.model, manifest.mean, manifest.std)
    if cfg.use_gpu:
        classifier = classifier.to(memory_format=torch.channels_last)
    model = prepare_model(classifier)
    plain = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        nesterov=cfg.momentum > 0,
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=max(cfg.lr, 1e-12), total_steps=cfg.epochs * steps
    )
    start_epoch = _resume(plain, optimizer, scheduler)

    def autocast() -> Any:
        if cfg.use_gpu:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    images, labels = images.to(device), labels.to(device)
    for epoch in range(start_epoch, cfg.epochs):
        epoch_start = time.perf_counter()
        order = torch.randperm(
            len(labels),
            generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch * 10 + rank),
        ).to(device)
        loss_sum = correct = seen = 0.0
        for step in range(steps):
            index = order[step * per_rank_batch : (step + 1) * per_rank_batch]
            x, y = augment(images[index]), labels[index]
            with autocast():
                logits = model(x)
            loss = nn.functional.cross_entropy(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
        loss_sum, correct, seen = _sum_across_ranks([loss_sum, correct, seen], device)
        val_loss, val_accuracy = _evaluate(model, val_images, val_labels, device, autocast)
        metrics = {
            "epoch": epoch,
            "train_loss": loss_sum / seen,
            "train_accuracy": correct / seen,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "epoch_time_s": time.perf_counter() - epoch_start,
        }
        logger.log(
            logging.INFO if rank == 0 else logging.DEBUG,
            "epoch %d/%d: train loss %.4f, val accuracy %.4f, %.1f s",
            epoch + 1,
            cfg.epochs,
            metrics["train_loss"],
            val_accuracy,
            metrics["epoch_time_s"],
        )
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                torch.save(
                    {
                        "model": plain.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "epoch": epoch,
                        "config": asdict(cfg),
                    },
                    os.path.join(directory, CHECKPOINT_FILE),
                )
            trainlib.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _resume(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> int:
    """Load the latest checkpoint if there is one; return the first epoch to train."""
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        state = torch.load(
            os.path.join(directory, CHECKPOINT_FILE), weights_only=True, map_location="cpu"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["epoch"]) + 1


def load_checkpoint_model(checkpoint_uri: str, manifest: Manifest) -> nn.Module:
    """The classifier saved in a training checkpoint (loaded with weights_only=True)."""
    with Checkpoint(checkpoint_uri).as_directory() as directory:
        state = torch.load(
            os.path.join(directory, CHECKPOINT_FILE), weights_only=True, map_location="cpu"
        )
    model = build_model(state["config"]["model"], manifest.mean, manifest.std)
    model.load_state_dict(state["model"])
    return model.eval()


def train_model(
    config: TrainConfig,
    *,
    num_workers: int,
    storage_path: str,
    run_name: str,
    dask: DaskConfig | None = None,
    callbacks: Sequence[trainlib.Callback] = (),
) -> TrainOutcome:
    """Run distributed training; checkpoints go to ``{storage_path}/runs/{run_name}``."""
    result = TorchTrainer(
        cifar_train_func,
        train_loop_config=asdict(config),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=config.use_gpu),
        run_config=RunConfig(
            name=run_name,
            storage_path=f"{storage_path.rstrip('/')}/runs",
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_accuracy"
            ),
            callbacks=callbacks,
        ),
        dask_config=dask,
    ).fit()
    best, best_metrics = result.best_checkpoints[0]
    return TrainOutcome(
        best_checkpoint_uri=best.filesystem.unstrip_protocol(best.path),
        best_metrics=best_metrics,
        final_metrics=result.metrics,
        run_path=result.filesystem.unstrip_protocol(result.path),
    )


@dataclass(frozen=True)
class TrainedRun:
    """A finished training run and its MLflow run."""

    run_id: str
    outcome: TrainOutcome


def train_tracked(
    config: TrainConfig,
    *,
    run_name: str,
    num_workers: int,
    storage_path: str,
    tracking_uri: str,
    dask: DaskConfig | None = None,
    experiment: str = "train-cifar",
    extra_callbacks: Sequence[trainlib.Callback] = (),
) -> TrainedRun:
    """Train with one MLflow run (created here, on the driver) receiving every report.

    Running the same ``run_name`` again (the driver died; a task retry) resumes from its latest
    checkpoint and continues the same MLflow run.
    """
    device = "cuda" if config.use_gpu else "cpu"
    params = {**asdict(config), "num_workers": num_workers}
    tags = {"world_size": str(num_workers), "device": device, "model": config.model}
    run_id = start_run(tracking_uri, experiment, run_name, params, tags)
    outcome = train_model(
        config,
        num_workers=num_workers,
        storage_path=storage_path,
        run_name=run_name,
        dask=dask,
        callbacks=[MLflowCallback(tracking_uri, run_id), *extra_callbacks],
    )
    return TrainedRun(run_id, outcome)


@task(name="train", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def train_task(
    config: TrainConfig,
    *,
    run_name: str,
    num_workers: int,
    storage_path: str,
    tracking_uri: str,
    dask: DaskConfig | None = None,
) -> TrainedRun:
    """Train, with progress and per-epoch metrics shown as Prefect artifacts.

    trainlib's and the pipeline's INFO lines (rank 0's included) go to this task's logs when
    PREFECT_LOGGING_EXTRA_LOGGERS names them (the deployments and `train-cifar` set it).
    """
    from tasks.monitoring import PrefectProgressCallback

    for name in ("trainlib", "tasks"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.INFO)

    return train_tracked(
        config,
        run_name=run_name,
        num_workers=num_workers,
        storage_path=storage_path,
        tracking_uri=tracking_uri,
        dask=dask,
        extra_callbacks=[PrefectProgressCallback(config.epochs)],
    )
