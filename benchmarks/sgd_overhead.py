"""PyTorchTrainer's overhead per call on a live group: train() on an empty dataset.

Two ranks (gloo) on the default LocalCluster run ``trainlib.sgd.PyTorchTrainer`` with a
``Linear`` model and an empty dataset, so a pass does no work: what a ``train()`` call costs
beyond its epoch is the command to every rank, the train function's call, the mean of the
metrics over the ranks and the report back. The train function times itself; the overhead is
the call's wall time minus that. Measured for ``train()`` (the default, ``max_retries=0``),
``train(max_retries=1)`` (which first saves the state to the run's storage, RaySGD's
``checkpoint="auto"``) and ``validate()``. Target: train() overhead <= 50 ms.

Run from the repository root: PYTHONPATH=. python benchmarks/sgd_overhead.py [--calls 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainlib import RunConfig
from trainlib.sgd import PyTorchTrainer, train_epoch


def model_creator(config: dict[str, Any]) -> torch.nn.Module:
    return torch.nn.Linear(4, 1)


def optimizer_creator(model: torch.nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01)


def data_creator(batch_size: int, config: dict[str, Any]) -> tuple[DataLoader, DataLoader]:
    # Loaders, not datasets: PyTorchTrainer loads a training dataset with shuffle=True, and
    # torch's RandomSampler refuses an empty dataset.
    empty = TensorDataset(torch.empty(0, 4), torch.empty(0, 1))
    return DataLoader(empty, batch_size=batch_size), DataLoader(empty, batch_size=batch_size)


def timed_train(*args: Any) -> dict[str, Any]:
    """The default train function, timing itself."""
    started = time.perf_counter()
    stats = train_epoch(*args)
    return {**stats, "epoch_s": time.perf_counter() - started}


def measure(call: Callable[[], dict[str, Any]], calls: int, warmup: int) -> dict[str, float]:
    """Median and 90th percentile of a call's wall time and of its overhead, in ms."""
    walls, overheads = [], []
    for index in range(warmup + calls):
        started = time.perf_counter()
        stats = call()
        wall = time.perf_counter() - started
        if index >= warmup:
            walls.append(wall * 1000)
            overheads.append((wall - stats.get("epoch_s", 0.0)) * 1000)
    deciles = statistics.quantiles(overheads, n=10)
    return {
        "wall_median_ms": round(statistics.median(walls), 1),
        "overhead_median_ms": round(statistics.median(overheads), 1),
        "overhead_p90_ms": round(deciles[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as storage:
        started = time.perf_counter()
        trainer = PyTorchTrainer(
            model_creator,
            data_creator,
            optimizer_creator,
            loss_creator=torch.nn.MSELoss,
            train_function=timed_train,
            num_replicas=2,
            batch_size=2,
            run_config=RunConfig(storage_path=storage),
        )
        start_s = time.perf_counter() - started
        try:
            results = {
                "trainer_start_s": round(start_s, 2),
                "train": measure(trainer.train, args.calls, args.warmup),
                "train_max_retries_1": measure(
                    lambda: trainer.train(max_retries=1), args.calls, args.warmup
                ),
                "validate": measure(trainer.validate, args.calls, args.warmup),
            }
        finally:
            trainer.shutdown()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
