"""train-cifar's training against a plain torchrun DDP script: epoch throughput, side by side.

Both train the same model with the same augmentation, optimizer (SGD, Nesterov momentum,
one-cycle schedule), global batch (256: 128 a rank), per-epoch validation over every rank and
a per-epoch checkpoint written by rank 0, on the same Parquet files (the pipeline's format):

- ``trainlib``: ``TorchTrainer(cifar.train_loop.cifar_train_func, datasets=...)`` with the
  pipeline's ``ingest_config`` (each rank keeps its share after the first epoch) on the default
  LocalCluster of 2 workers; an epoch is the interval between two reports reaching the driver
  (the checkpoint committed).
- ``torchrun``: ``torchrun --standalone --nproc_per_node=2`` of ``plain_main`` below: the files
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

ROWS_PER_FILE = 2500
GLOBAL_BATCH = 256
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


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
    from cifar.checkpoint import ModelSpec
    from cifar.dataset import ingest_config, split_arrays
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


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of ``root`` and every process under it, by pid."""
    import psutil

    seconds: dict[str, float] = {}
    top = psutil.Process(root)
    for process in [top, *top.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[str(process.pid)] = times.user + times.system
    return seconds


def steady_cpu(samples: list[dict[str, float]], ranks: int) -> tuple[float, float]:
    """Median CPU seconds per steady epoch of one rank (the mean of the ``ranks`` busiest
    processes) and of all the other processes together."""
    per_rank, rest = [], []
    for before, after in itertools.pairwise(samples):
        used = sorted((s - before.get(pid, 0.0) for pid, s in after.items()), reverse=True)
        per_rank.append(sum(used[:ranks]) / ranks)
        rest.append(sum(used[ranks:]))
    return statistics.median(per_rank), statistics.median(rest)


def plain_main(dataset_uri: str, options: argparse.Namespace, out: str) -> None:
    """The plain DDP script (run by torchrun): rank 0 writes its epoch durations to ``out``.

    On a GPU: NCCL, the data in GPU memory, bf16 autocast (fp16 where bf16 is missing, with
    loss scaling), channels_last, and ``torch.compile`` with ``--compile``: what the
    pipeline's training function does.
    """
    import torch
    import torch.distributed as dist
    from torch import nn

    from cifar.augment import augment
    from cifar.checkpoint import ModelSpec
    from cifar.dataset import Dataset, read_manifest, read_split

    gpu = options.gpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = read_manifest(dataset_uri)
    assert manifest is not None
    dataset = Dataset(dataset_uri, manifest)
    train, val = read_split(dataset, "train"), read_split(dataset, "val")
    images, labels = torch.from_numpy(train.images).to(device), torch.from_numpy(train.labels)
    labels = labels.to(device)
    val_images = torch.from_numpy(val.images).to(device)
    val_labels = torch.from_numpy(val.labels).to(device)
    per_rank = GLOBAL_BATCH // world
    steps = (len(labels) // world) // per_rank
    torch.manual_seed(0)
    classifier = ModelSpec(options.model, manifest.mean, manifest.std).build().to(device)
    memory_format = torch.channels_last if gpu else torch.contiguous_format
    classifier = classifier.to(memory_format=memory_format)
    model: nn.Module = nn.parallel.DistributedDataParallel(classifier) if world > 1 else classifier
    if options.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    dtype = None
    if gpu:
        native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        dtype = torch.bfloat16 if native_bf16 else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.05, total_steps=options.epochs * steps
    )
    ends, cpu = [], []
    for epoch in range(options.epochs):
        model.train()
        generator = torch.Generator().manual_seed(epoch)
        mine = torch.randperm(len(labels), generator=generator)[rank::world].to(device)
        totals = torch.zeros(3, dtype=torch.float64, device=device)
        for step in range(steps):
            rows = mine[step * per_rank : (step + 1) * per_rank]
            batch = augment(images[rows]).contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(batch)
            loss = nn.functional.cross_entropy(logits.float(), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            totals += _totals(loss.detach() * len(rows), logits, labels[rows])
        dist.all_reduce(totals)
        model.eval()
        evaluation = torch.zeros(3, dtype=torch.float64, device=device)
        with torch.no_grad():
            share = len(val_labels) // world  # equal shares: DDP's forward is a collective
            for start in range(rank * share, (rank + 1) * share, 1024):
                stop = min(start + 1024, (rank + 1) * share)
                chunk = val_images[start:stop].contiguous(memory_format=memory_format)
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    logits = model(chunk)
                target = val_labels[start:stop]
                loss_sum = nn.functional.cross_entropy(logits.float(), target, reduction="sum")
                evaluation += _totals(loss_sum, logits, target)
        dist.all_reduce(evaluation)
        float(totals[0] + evaluation[0])  # the epoch's figures reach the host, as in the pipeline
        if rank == 0:
            state = {
                "model": classifier.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": epoch,
            }
            torch.save(state, os.path.join(os.path.dirname(out), f"checkpoint-{epoch}.pt"))
        dist.barrier()
        ends.append(time.monotonic())
        if rank == 0:
            cpu.append(tree_cpu(os.getppid()))  # torchrun's agent and its ranks
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"durations": list(np.diff(ends)), "cpu": cpu}, f)
    dist.barrier()
    dist.destroy_process_group()


def _totals(loss_sum: Any, logits: Any, labels: Any) -> Any:
    import torch

    correct = (logits.argmax(1) == labels).sum()
    seen = torch.full((), len(labels), device=labels.device)  # a fill, not a host copy
    return torch.stack([loss_sum.double(), correct.double(), seen.double()])


def run_torchrun(dataset: Any, options: argparse.Namespace) -> Epochs:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "epochs.json")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={_ranks(options)}",
            __file__,
            "--plain",
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
    parser.add_argument("--plain", metavar="DATASET_URI")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.plain:
        plain_main(args.plain, args, args.out)
        return
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
