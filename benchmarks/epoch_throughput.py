"""train-cifar's training against a plain torchrun DDP script: epoch throughput, side by side.

Both train the same model with the same augmentation, optimizer (SGD, Nesterov momentum,
one-cycle schedule), global batch (256: 128 a rank), per-epoch validation over every rank and
a per-epoch checkpoint written by rank 0, on the same Parquet files (the pipeline's format):

- ``trainlib``: ``TorchTrainer(cifar.train_loop.cifar_train_func, datasets=...)`` with the
  pipeline's ``ingest_config`` (each rank keeps its share after the first epoch) on the default
  LocalCluster of 2 workers; an epoch is the interval between two reports reaching the driver
  (the checkpoint committed).
- ``torchrun``: ``torchrun --standalone --nproc_per_node=2`` of ``plain_ddp.py``: the files
  read into memory before training, a seeded permutation split between the ranks every epoch;
  an epoch is the interval between two checkpoints of rank 0.

The first epoch of each is left out (trainlib's first streams the data from Dask; torchrun's
read it before). Modes alternate, the first mode alternating too, for ``--rounds`` rounds.
Throughput = training images per second over the steady epochs (medians of rounds).

CPU time per steady epoch is measured too, per process of each mode's process tree (the
benchmark's own process, its LocalCluster and ranks; torchrun's agent and ranks): the ranks'
CPU seconds say whether a rank does more work per epoch, the rest's what the machinery around
them takes from the 2 cores. Time stolen by the hypervisor is not counted, but the cores'
speed still varies (a rank's CPU seconds an epoch varied by ±5% between runs of one mode here),
so compare ranks over several rounds; the rest of the tree varies much less.

Run: python benchmarks/epoch_throughput.py [--images 45000] [--model small_cnn] [--epochs 3]
    [--rounds 3] [--gpu] [--compile]
On a GPU machine: make gpu-benchmark (both models, compile off and on).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple

import numpy as np
from plain_ddp import GLOBAL_BATCH, tree_cpu

ROWS_PER_FILE = 2500
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
PLAIN_DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")


def write_dataset(root: str, train_rows: int, val_rows: int) -> Any:
    """Random CIFAR-shaped images in the pipeline's Parquet format (train and val)."""
    from cifar.dataset import Dataset, Manifest, write_file, write_manifest

    os.makedirs(root)
    rng = np.random.default_rng(0)
    splits: dict[str, list[Any]] = {}
    for split, rows in (("train", train_rows), ("val", val_rows)):
        splits[split] = []
        for index, start in enumerate(range(0, rows, ROWS_PER_FILE)):
            count = min(ROWS_PER_FILE, rows - start)
            images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
            labels = rng.integers(0, 10, count)
            path = os.path.join(root, f"{split}-{index:05d}.parquet")
            splits[split].append(write_file(path, images, labels))
    manifest = Manifest("synthetic", False, tuple(map(str, range(10))), MEAN, STD, 0.1, 0, splits)
    write_manifest(root, manifest)
    return Dataset(root, manifest)


def run_trainlib(dataset: Any, options: argparse.Namespace, storage: str) -> Epochs:
    """Epoch durations and CPU samples of the pipeline's training function under TorchTrainer."""
    import trainlib
    from cifar.dataset import ingest_config, split_arrays
    from cifar.models import ModelSpec
    from cifar.train_loop import TrainConfig, cifar_train_func, loop_config
    from trainlib.torch import TorchTrainer

    class EpochClock(trainlib.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu: list[dict[str, float]] = []

        def on_report(self, report: trainlib.Report) -> None:
            self.times.append(time.monotonic())
            self.cpu.append(tree_cpu(os.getpid()))

    clock = EpochClock()
    config = TrainConfig(
        model=options.model,
        epochs=options.epochs,
        batch_size=GLOBAL_BATCH,
        use_gpu=options.gpu,
        compile=options.compile,
    )
    spec = ModelSpec(options.model, dataset.manifest.mean, dataset.manifest.std)
    TorchTrainer(
        cifar_train_func,
        train_loop_config=loop_config(config, spec, dataset.manifest.rows("train")),
        datasets={s: split_arrays(dataset, s) for s in ("train", "val")},
        dataset_config=ingest_config(use_gpu=options.gpu),
        scaling_config=trainlib.ScalingConfig(num_workers=_ranks(options), use_gpu=options.gpu),
        run_config=trainlib.RunConfig(storage_path=storage, callbacks=[clock]),
    ).fit()
    return Epochs([float(d) for d in np.diff(clock.times)], clock.cpu)


def _ranks(options: argparse.Namespace) -> int:
    return 1 if options.gpu else 2


class Epochs(NamedTuple):
    durations: list[float]  # between consecutive epoch ends (the first epoch left out)
    cpu: list[dict[str, float]]  # at every epoch end: pid -> CPU seconds, the whole tree


def steady_cpu(samples: list[dict[str, float]], ranks: int) -> tuple[float, float]:
    """Median CPU seconds per steady epoch of one rank (the mean of the ``ranks`` busiest
    processes) and of all the other processes together."""
    per_rank, rest = [], []
    for before, after in itertools.pairwise(samples):
        used = sorted((s - before.get(pid, 0.0) for pid, s in after.items()), reverse=True)
        per_rank.append(sum(used[:ranks]) / ranks)
        rest.append(sum(used[ranks:]))
    return statistics.median(per_rank), statistics.median(rest)


def run_torchrun(dataset: Any, options: argparse.Namespace) -> Epochs:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "epochs.json")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={_ranks(options)}",
            PLAIN_DDP,
            dataset.uri,
            "--out",
            out,
            *_flags(options),
        ]
        ran = subprocess.run(command, capture_output=True, text=True)
        if ran.returncode != 0:  # the ranks' own error, not only torchrun's exit status
            raise RuntimeError(f"the torchrun script failed:\n{ran.stderr[-4000:]}")
        with open(out) as f:
            measured = json.load(f)
        return Epochs(measured["durations"], measured["cpu"])


def _flags(options: argparse.Namespace) -> list[str]:
    flags = ["--model", options.model, "--epochs", str(options.epochs)]
    return flags + ["--gpu"] * options.gpu + ["--compile"] * options.compile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=45000)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="one rank on GPU 0, bf16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        dataset = write_dataset(os.path.join(folder, "data"), args.images, args.images // 9)
        throughput: dict[str, list[float]] = {"trainlib": [], "torchrun": []}
        rank_cpu: dict[str, list[float]] = {"trainlib": [], "torchrun": []}
        rest_cpu: dict[str, list[float]] = {"trainlib": [], "torchrun": []}
        for round_index in range(args.rounds):
            modes = ("trainlib", "torchrun") if round_index % 2 == 0 else ("torchrun", "trainlib")
            for mode in modes:
                if mode == "trainlib":
                    storage = os.path.join(folder, f"runs-{round_index}")
                    epochs = run_trainlib(dataset, args, storage)
                else:
                    epochs = run_torchrun(dataset, args)
                steady = statistics.median(epochs.durations)  # the intervals after the first
                images_per_s = (args.images // GLOBAL_BATCH) * GLOBAL_BATCH / steady
                throughput[mode].append(images_per_s)
                one_rank, others = steady_cpu(epochs.cpu, _ranks(args))
                rank_cpu[mode].append(one_rank)
                rest_cpu[mode].append(others)
                print(
                    f"round {round_index + 1} {mode}: epochs "
                    f"{[round(e, 2) for e in epochs.durations]} s, {images_per_s:,.0f} images/s;"
                    f" CPU a steady epoch: {one_rank:.2f} s a rank, {others:.2f} s the rest",
                    flush=True,
                )
    ratios = [a / b for a, b in zip(throughput["trainlib"], throughput["torchrun"], strict=True)]
    trainlib_median = statistics.median(throughput["trainlib"])
    torchrun_median = statistics.median(throughput["torchrun"])
    where = "1 GPU rank, bf16, channels_last" if args.gpu else "2 CPU ranks, gloo"
    print(
        f"\n{args.model}, {where}, compile {'on' if args.compile else 'off'}, "
        f"{args.images:,} training images, {args.rounds} rounds, "
        f"{args.epochs} epochs each (the first left out)"
    )
    print(
        "| mode | images/s (median) | per round | CPU s a steady epoch: one rank | "
        "the rest of the tree |"
    )
    print("|---|---|---|---|---|")
    for mode in ("torchrun", "trainlib"):
        rounds = " / ".join(f"{v:,.0f}" for v in throughput[mode])
        print(
            f"| {mode} | {statistics.median(throughput[mode]):,.0f} | {rounds} | "
            f"{statistics.median(rank_cpu[mode]):.2f} | {statistics.median(rest_cpu[mode]):.2f} |"
        )
    print(
        f"\ntrainlib / torchrun: {trainlib_median / torchrun_median:.3f}x (ratio of medians), "
        f"{statistics.median(ratios):.3f}x (median of per-round ratios)"
    )


if __name__ == "__main__":
    main()
