"""Train a small CNN with 2 DDP ranks on a local Dask cluster (trainlib's quickstart).

The data is synthetic and CIFAR-shaped (3x32x32, 10 classes): each class has its own colour
pattern plus noise, so accuracy well above chance (10%) shows that training works.

Run: python examples/train_cnn.py [--epochs 3] [--num-workers 2] [--storage-path DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from typing import Any

import distributed  # noqa: F401  (configures its loggers on import; quieted in main)
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainlib
from trainlib import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer, get_device, prepare_data_loader, prepare_model

logger = logging.getLogger("train_cnn")


def synthetic_cifar(num_samples: int, seed: int) -> TensorDataset:
    """CIFAR-shaped images whose class is a fixed random pattern plus noise."""
    patterns = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (num_samples,), generator=generator)
    images = patterns[labels] + 2.0 * torch.randn(num_samples, 3, 32, 32, generator=generator)
    return TensorDataset(images, labels)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


def evaluate(model: nn.Module, loader: DataLoader[Any]) -> float:
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += len(labels)
    model.train()
    return correct / total


def train_func(config: dict[str, Any]) -> None:
    model = prepare_model(small_cnn())
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    per_rank_batch = config["batch_size"] // trainlib.get_context().get_world_size()
    train = prepare_data_loader(
        DataLoader(synthetic_cifar(2048, seed=1), batch_size=per_rank_batch, shuffle=True)
    )
    val = prepare_data_loader(DataLoader(synthetic_cifar(512, seed=2), batch_size=256))
    for epoch in range(config["epochs"]):
        for images, labels in train:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        accuracy = evaluate(model, val)
        logger.info(
            "epoch %d: loss %.3f, val accuracy %.3f (%s)",
            epoch,
            loss.item(),
            accuracy,
            get_device(),
        )
        with tempfile.TemporaryDirectory() as directory:
            if trainlib.get_context().get_world_rank() == 0:
                plain = model.module if hasattr(model, "module") else model
                torch.save(plain.state_dict(), os.path.join(directory, "model.pt"))
            trainlib.report(
                {"epoch": epoch, "loss": loss.item(), "val_accuracy": accuracy},
                checkpoint=Checkpoint.from_directory(directory),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--storage-path", default="./trainlib_results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)  # after Dask set it on import
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(
            storage_path=os.path.abspath(args.storage_path),
            checkpoint_config=CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute="val_accuracy"
            ),
        ),
    )
    result = trainer.fit()
    best, metrics = result.best_checkpoints[0]
    print(
        f"val accuracy {result.metrics['val_accuracy']:.3f} after {args.epochs} epochs "
        f"(chance is 0.100); best checkpoint {best.path} (val accuracy "
        f"{metrics['val_accuracy']:.3f})"
    )


if __name__ == "__main__":
    main()
