"""trainlib.tune on a warm 2-worker cluster: trial start latency, and ASHA against running every
trial to completion.

8 trials x 1 rank train the pipeline's small CNN on synthetic CIFAR-shaped data (uint8 images
3x32x32, 512 to train and 256 to validate, 10 classes, each class a blocky colour pattern
under noise), one report of validation accuracy per epoch, 8 epochs at most. The search
space is lr (log-uniform) and batch size; random search with a fixed seed, so both searches
propose the same 8 configs:

    asha  ASHAScheduler(max_t=8, grace_period=1, reduction_factor=4)
    full  FIFOScheduler(): every trial runs its 8 epochs

The cluster is the default LocalCluster (workers are threads of this process, each rank a
process of its own), started once with warm rank processes; a 2-trial warm-up search runs first.

Measured, median over the trials of both searches:
    trial start   from the trial's thread starting in the driver to its train function
                  running in the rank (the rank's clock: same machine)
    first report  from the same start to the first report (after one epoch) reaching the driver
    wall          each search's fit(), and the best val_accuracy it found

Before them, 8 trials of a function that builds a Linear model and reports at once measure
the trial start as its target is stated (<= 0.5 s): trial start -> first report at the driver.

Run: python benchmarks/tune.py [--trials 8] [--epochs 8]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from typing import Any

from trainlib import Callback, DaskConfig, Report, RunConfig, tune

REDUCTION = 4
TRAIN_IMAGES = 512
VAL_IMAGES = 256


def train_cnn(config: dict[str, Any]) -> None:
    """One rank: the small CNN on synthetic CIFAR-shaped data, val accuracy each epoch."""
    started_at = time.time()
    import torch
    from torch import nn

    import trainlib
    from cifar.models import build_model

    generator = torch.Generator().manual_seed(0)
    # Each class a blocky colour pattern (4x4 cells) under noise: learnable in a few epochs.
    cells = torch.rand(10, 3, 4, 4, generator=generator) * 255
    patterns = cells.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)

    def split(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 10, (size,), generator=generator)
        noise = torch.rand(size, 3, 32, 32, generator=generator) * 255
        images = (0.5 * patterns[labels] + 0.5 * noise).to(torch.uint8)
        return images, labels

    train_x, train_y = split(TRAIN_IMAGES)
    val_x, val_y = split(VAL_IMAGES)
    torch.manual_seed(0)
    model = build_model("small_cnn", mean=(0.5,) * 3, std=(0.25,) * 3)  # of pixels / 255
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    batch = config["batch_size"]
    for _ in range(config["epochs"]):
        model.train()
        order = torch.randperm(len(train_y))
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            loss = nn.functional.cross_entropy(model(train_x[index]), train_y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(val_x).argmax(1) == val_y).float().mean().item()
        accuracy = accuracy if accuracy == accuracy else 0.0  # NaN after divergence
        trainlib.report({"val_accuracy": accuracy, "started_at": started_at})


def report_at_once(config: dict[str, Any]) -> None:
    """One rank: a Linear model, one report at once (the trial start latency)."""
    started_at = time.time()
    import torch

    import trainlib

    loss = torch.nn.Linear(4, 1)(torch.ones(4)).item() * config["scale"]
    trainlib.report({"loss": loss, "started_at": started_at})


class StartTimes(Callback, logging.Handler):
    """Each trial's start (its 'Trial ... starting' log record), when its train function began
    in the rank (reported with the metrics) and when its first report reached the driver."""

    def __init__(self) -> None:
        Callback.__init__(self)
        logging.Handler.__init__(self, logging.INFO)
        self.started: dict[str, float] = {}
        self.first_report: dict[str, float] = {}
        self.function_started: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Trial ") and "starting" in record.getMessage():
            self.started[record.threadName or ""] = record.created

    def on_report(self, report: Report) -> None:
        thread = threading.current_thread().name
        self.first_report.setdefault(thread, time.time())
        self.function_started.setdefault(thread, report.metrics["started_at"])

    def latencies(self) -> tuple[list[float], list[float]]:
        """Per trial: start -> train function running, start -> first report at the driver."""
        ready = [t for t in self.started if t in self.first_report]
        return (
            [self.function_started[t] - self.started[t] for t in ready],
            [self.first_report[t] - self.started[t] for t in ready],
        )

    def reset(self) -> None:
        self.started.clear()
        self.first_report.clear()
        self.function_started.clear()


def search(
    client: Any,
    trainable: Any,
    param_space: dict[str, Any],
    metric: str,
    scheduler: tune.TrialScheduler,
    trials: int,
    root: str,
    name: str,
    times: StartTimes,
) -> tuple[float, float]:
    """One search; returns its wall time and the best value of ``metric``."""
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=metric,
            mode="max" if metric == "val_accuracy" else "min",
            num_samples=trials,
            max_concurrent_trials=2,
            search_alg=tune.BasicVariantGenerator(seed=0),
            scheduler=scheduler,
        ),
        run_config=RunConfig(name=name, storage_path=root, callbacks=[times]),
        client=client,
    )
    started = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - started
    best = grid.get_best_result()
    print(f"  {name}: states {grid.trial_states}")
    return wall, float(best.metrics[metric])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    times = StartTimes()
    trials_logger = logging.getLogger("trainlib.tune._trials")
    trials_logger.addHandler(times)
    trials_logger.setLevel(logging.INFO)
    asha = tune.ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=REDUCTION)
    fifo = tune.FIFOScheduler()
    cnn_space = {
        "lr": tune.loguniform(1e-3, 0.3),
        "batch_size": tune.choice([16, 32, 64]),
        "epochs": args.epochs,
    }
    quick_space = {"scale": tune.uniform(0.5, 2.0)}
    cnn = (train_cnn, cnn_space, "val_accuracy")
    quick = (report_at_once, quick_space, "loss")
    with (
        tempfile.TemporaryDirectory() as root,
        DaskConfig().connect(num_workers=2, wait=True, warm_ranks=True) as client,
    ):
        search(client, *quick, fifo, 2, root, "warm-up", times)
        times.reset()
        search(client, *quick, fifo, args.trials, root, "start", times)
        to_function, to_report = times.latencies()
        times.reset()
        asha_wall, asha_best = search(client, *cnn, asha, args.trials, root, "asha", times)
        cnn_function = times.latencies()[0]
        times.reset()
        full_wall, full_best = search(client, *cnn, fifo, args.trials, root, "full", times)
        cnn_function += times.latencies()[0]
    for label, values in (
        ("train function running (Linear)", to_function),
        ("first report at the driver (Linear)", to_report),
        ("train function running (CNN searches)", cnn_function),
    ):
        print(
            f"trial start -> {label}: median {statistics.median(values):.2f} s "
            f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} trials)"
        )
    print(f"asha: {asha_wall:.1f} s, best val_accuracy {asha_best:.3f}")
    print(f"full: {full_wall:.1f} s, best val_accuracy {full_best:.3f}")
    print(f"asha / full wall time: {asha_wall / full_wall:.0%}")


if __name__ == "__main__":
    main()
