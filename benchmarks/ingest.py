"""Data ingest into the ranks: images/s, CNN step time and rank memory, measured inside ranks.

A Parquet dataset in the pipeline's format (``cifar/dataset.py``: an image column of 3,072
fixed-size bytes, a 3x32x32 uint8 image, plus an int64 label; 2,500 rows a file) is written to a
temporary folder, then three measurements run, each inside ``TorchTrainer`` rank processes on
the default LocalCluster:

- ``throughput`` (1 rank): images/s delivered by one pass of
  ``get_dataset_shard(...).iter_torch_batches(batch_size=256)`` over all rows, for
  ``transform``: ``dd.read_parquet(...).map_partitions(decode_images)`` (bytes to arrays);
  ``arrays``: the files as Dask arrays, no transform (``cifar.dataset.split_arrays``: what the
  pipeline trains on); ``dataloader``: a torch ``DataLoader(num_workers=2)`` whose workers read
  the same files; ``memory``: the limit, slicing a tensor already in the rank's memory.
  The four alternate, pass by pass, in the same rank. ``cached``: the ``arrays`` source with
  ``DataConfig(cache_shards="host")`` in a run of its own (its warm-up pass streams and is
  kept; the measured passes read the kept shard). Each pass also gives its start: the time to
  its first batch.
- ``training`` (2 ranks, gloo DDP): the pipeline's small CNN trained on the ``arrays`` source
  through ``datasets=``, and on the same rows sliced from a tensor in the rank's memory,
  alternating pass by pass (which goes first alternates too); the step time is the median
  interval between step ends (so it includes waiting for the batch) after the warm-up steps.
- ``memory growth`` (1 rank, a fresh rank process each): the rank's peak RSS after one pass
  over ``--rows`` rows and over ``--scale`` times as many, as ``ru_maxrss`` and as VmHWM (see
  ``memory_status_mib`` for why both).

Targets: >= 30,000 images/s into a rank without a transform; the step through ``datasets=``
<= 1.05x the in-memory step; rank peak RSS grows <= 10% when the dataset grows 10x.

Run: python benchmarks/ingest.py [--rows 60000] [--rounds 3] [--train-rows 10000]
     [--train-rounds 3] [--scale 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from cifar.dataset import DataFile, Dataset, Manifest

ROWS_PER_FILE = 2500  # the pipeline's default shard size
BATCH_SIZE = 256
THROUGHPUT_SOURCES = ("transform", "arrays", "dataloader", "memory", "cached")
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


# --- the dataset ---------------------------------------------------------------------------


def write_dataset(root: str, rows: int) -> Dataset:
    """``rows`` random CIFAR-shaped images in the pipeline's Parquet format, with a manifest."""
    from cifar.dataset import write_file, write_manifest

    os.makedirs(root)
    rng = np.random.default_rng(0)
    files = []
    for index, start in enumerate(range(0, rows, ROWS_PER_FILE)):
        count = min(ROWS_PER_FILE, rows - start)
        images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, count)
        files.append(write_file(os.path.join(root, f"train-{index:05d}.parquet"), images, labels))
    manifest = Manifest(
        source_md5="synthetic",
        source_verified=False,
        class_names=tuple(str(c) for c in range(10)),
        mean=MEAN,
        std=STD,
        val_fraction=0.0,
        seed=0,
        splits={"train": files},
    )
    write_manifest(root, manifest)
    return Dataset(root, manifest)


def first_files(dataset: Dataset, rows: int) -> Dataset:
    """The dataset cut to its first files holding at least ``rows`` rows."""
    files: list[DataFile] = []
    for entry in dataset.manifest.splits["train"]:
        if sum(f.rows for f in files) >= rows:
            break
        files.append(entry)
    return Dataset(dataset.uri, replace(dataset.manifest, splits={"train": files}))


def decode_images(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``map_partitions`` transform: each row's 3,072 bytes as a (3, 32, 32) uint8 array."""
    flat = np.frombuffer(b"".join(frame["image"]), np.uint8)
    return frame.assign(image=list(flat.reshape(len(frame), 3, 32, 32)))


def transformed_frame(dataset: Dataset) -> Any:
    import dask.dataframe as dd

    paths = [os.path.join(dataset.uri, f.file) for f in dataset.manifest.splits["train"]]
    return dd.read_parquet(paths).map_partitions(
        decode_images, meta={"image": object, "label": "i8"}
    )


# --- inside the ranks ----------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident set size (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_status_mib() -> dict[str, float]:
    """VmHWM (peak RSS of this process image, since its exec) and VmRSS, from /proc (Linux).

    Linux keeps ``ru_maxrss`` across ``execve``, and a rank process is started (fork/exec) by
    its Dask worker's process, the driver with the default LocalCluster: a rank's ``ru_maxrss``
    starts at the driver's peak and can hide the rank's own growth. VmHWM is the rank's own.
    """
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                found[key] = int(value.split()[0]) / 1024
    return found


def timed_pass(batches: Iterable[dict[str, Any]]) -> tuple[int, float, float]:
    """Rows and seconds of one pass, from asking for the first batch to receiving the last,
    and the seconds to the first batch."""
    started, rows, first = time.perf_counter(), 0, 0.0
    for batch in batches:
        if not rows:
            first = time.perf_counter() - started
        rows += len(batch["label"])
    return rows, time.perf_counter() - started, first


def memory_batches(images: Any, labels: Any, batch_size: int) -> Iterator[dict[str, Any]]:
    """Batches sliced from tensors already in the rank's memory: the limit."""
    for start in range(0, len(labels), batch_size):
        yield {
            "image": images[start : start + batch_size],
            "label": labels[start : start + batch_size],
        }


class ParquetBatches(torch.utils.data.IterableDataset[dict[str, Any]]):
    """A torch IterableDataset: each DataLoader worker reads its share of the Parquet files
    (``cifar.dataset.read_file``, as the Dask tasks do) and yields batches of ``batch_size``."""

    def __init__(self, dataset: Dataset, batch_size: int) -> None:
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from cifar.dataset import read_file

        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        images, labels = torch.empty(0, 3, 32, 32, dtype=torch.uint8), torch.empty(0).long()
        for entry in self.dataset.manifest.splits["train"][worker::workers]:
            batch = read_file(self.dataset.uri, entry)
            images = torch.cat([images, torch.from_numpy(batch.images)])
            labels = torch.cat([labels, torch.from_numpy(batch.labels)])
            while len(labels) >= self.batch_size:
                yield {"image": images[: self.batch_size], "label": labels[: self.batch_size]}
                images, labels = images[self.batch_size :], labels[self.batch_size :]
        if len(labels):
            yield {"image": images, "label": labels}


def throughput_loop(config: dict[str, Any]) -> None:
    """Alternates one pass of each source per round; reports images/s of each."""
    import trainlib
    from cifar.dataset import read_split

    dataset: Dataset = config["dataset"]
    whole = read_split(dataset, "train")
    images, labels = torch.from_numpy(whole.images), torch.from_numpy(whole.labels)
    loader = torch.utils.data.DataLoader(
        ParquetBatches(dataset, BATCH_SIZE), batch_size=None, num_workers=2
    )
    sources: dict[str, Iterable[dict[str, Any]]] = {
        "dataloader": loader,
        "memory": _Restartable(lambda: memory_batches(images, labels, BATCH_SIZE)),
    }
    for name in ("transform", "arrays", "cached"):
        if name in config["sources"]:
            shard = trainlib.get_dataset_shard(name)
            sources[name] = shard.iter_torch_batches(batch_size=BATCH_SIZE)
    for round_index in range(config["warmup_rounds"] + config["rounds"]):
        metrics: dict[str, Any] = {"round": round_index - config["warmup_rounds"]}
        for name in config["sources"]:
            batches = sources[name]
            cpu_started = time.process_time()
            rows, seconds, first = timed_pass(batches)
            metrics[f"{name}_images_per_s"] = rows / seconds
            metrics[f"{name}_start_ms"] = first * 1e3
            metrics[f"{name}_rank_cpu_s"] = time.process_time() - cpu_started
            metrics[f"{name}_rows"] = rows
        trainlib.report(metrics)


class _Restartable:
    """An iterable starting a new pass each time it is iterated (as iter_torch_batches does)."""

    def __init__(self, start: Any) -> None:
        self._start = start

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._start())


def training_loop(config: dict[str, Any]) -> None:
    """The small CNN, DDP on 2 ranks: one pass from memory, one through datasets=, per round."""
    from torch import nn

    import trainlib
    from cifar.dataset import read_split
    from cifar.models import build_model
    from trainlib.torch import prepare_model

    context = trainlib.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    batch_size, warmup = config["batch_size"], config["warmup_steps"]
    whole = read_split(config["dataset"], "train")
    share = len(whole.labels) // world_size // batch_size * batch_size  # as with drop_last
    mine = slice(rank * share, rank * share + share)
    images = torch.from_numpy(whole.images[mine].copy())
    labels = torch.from_numpy(whole.labels[mine].copy())
    del whole
    torch.manual_seed(0)
    model = prepare_model(build_model("small_cnn", MEAN, STD))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch: dict[str, Any]) -> None:
        loss = nn.functional.cross_entropy(model(batch["image"]), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def run_pass(batches: Iterable[dict[str, Any]]) -> tuple[float, float, int]:
        started = last = time.perf_counter()
        intervals = []
        for batch in batches:
            step(batch)
            now = time.perf_counter()
            intervals.append(now - last)
            last = now
        return statistics.median(intervals[warmup:]), last - started, len(intervals)

    train = trainlib.get_dataset_shard("train")
    for round_index in range(config["rounds"] + 1):  # round 0 warms up both paths
        passes = {
            "memory": lambda: run_pass(memory_batches(images, labels, batch_size)),
            "datasets": lambda: run_pass(
                train.iter_torch_batches(batch_size=batch_size, drop_last=True)
            ),
        }
        order = ["memory", "datasets"] if round_index % 2 else ["datasets", "memory"]
        timed = {name: passes[name]() for name in order}
        in_memory, through_datasets = timed["memory"], timed["datasets"]
        trainlib.report(
            {
                "round": round_index - 1,
                "memory_step_s": in_memory[0],
                "memory_pass_s": in_memory[1],
                "memory_steps": in_memory[2],
                "datasets_step_s": through_datasets[0],
                "datasets_pass_s": through_datasets[1],
                "datasets_steps": through_datasets[2],
            }
        )


def memory_loop(config: dict[str, Any]) -> None:
    """One pass over the whole dataset; reports the rank's peak RSS before and after."""
    import trainlib

    before, status_before = peak_rss_mib(), memory_status_mib()
    rows, seconds = timed_pass(
        trainlib.get_dataset_shard("train").iter_torch_batches(batch_size=BATCH_SIZE)
    )
    trainlib.report(
        {
            "rows": rows,
            "images_per_s": rows / seconds,
            "peak_rss_before_mib": before,
            "peak_rss_mib": peak_rss_mib(),
            "hwm_before_mib": status_before["VmHWM"],
            "rss_before_mib": status_before["VmRSS"],
            "hwm_mib": memory_status_mib()["VmHWM"],
        }
    )


# --- the harness ---------------------------------------------------------------------------


def fit(
    train_func: Any,
    config: dict[str, Any],
    datasets: dict[str, Any],
    num_workers: int,
    storage: str,
    cache: bool = False,
) -> list[dict[str, Any]]:
    """Run ``train_func`` on ``num_workers`` ranks; rank 0's reports."""
    from trainlib import DataConfig, RunConfig, ScalingConfig
    from trainlib.torch import TorchTrainer

    result = TorchTrainer(
        train_func,
        train_loop_config=config,
        datasets=datasets,
        dataset_config=DataConfig(cache_shards="host" if cache else "off"),
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(storage_path=storage),
    ).fit()
    return result.metrics_history


def measure_throughput(
    dataset: Dataset, rounds: int, sources: tuple[str, ...], storage: str
) -> None:
    from cifar.dataset import split_arrays

    streamed = tuple(s for s in sources if s != "cached")
    config = {"dataset": dataset, "rounds": rounds, "warmup_rounds": 1, "sources": streamed}
    datasets = {"transform": transformed_frame(dataset), "arrays": split_arrays(dataset, "train")}
    history = fit(throughput_loop, config, datasets, 1, storage) if streamed else []
    if "cached" in sources:  # a run of its own: DataConfig applies to every dataset
        config = {**config, "sources": ("cached",)}
        datasets = {"cached": split_arrays(dataset, "train")}
        kept = fit(throughput_loop, config, datasets, 1, storage, cache=True)
        history = [{**a, **b} for a, b in zip(history, kept, strict=True)] if history else kept
    measured = [m for m in history if m["round"] >= 0]
    medians = {s: statistics.median(m[f"{s}_images_per_s"] for m in measured) for s in sources}
    base = medians.get("arrays", 0.0)
    print(f"\nImages/s into one rank, iter_torch_batches(batch_size={BATCH_SIZE}), {rounds} rounds")
    print(
        f"{'source':10s} {'median':>12s} {'vs arrays':>10s} {'rank CPU/pass':>14s} "
        f"{'pass start':>11s}  per round"
    )
    for source in sources:
        per_round = " / ".join(f"{m[f'{source}_images_per_s']:,.0f}" for m in measured)
        cpu = statistics.median(m[f"{source}_rank_cpu_s"] for m in measured)
        start = statistics.median(m[f"{source}_start_ms"] for m in measured)
        ratio = medians[source] / (base or medians[source])
        print(
            f"{source:10s} {medians[source]:12,.0f} {ratio:9.3f}x {cpu:12.2f} s "
            f"{start:8.1f} ms  {per_round}"
        )
    rows = measured[0][f"{sources[0]}_rows"]
    print(
        f"(each pass: {rows:,} rows; rank CPU: process time of the rank during the pass, "
        "DataLoader workers not included)"
    )
    if base:
        verdict = "met" if base >= 30_000 else "NOT met"
        print(f"target >= 30,000 images/s without a transform: {base:,.0f} ({verdict})")


def measure_training(dataset: Dataset, rounds: int, batch_size: int, storage: str) -> None:
    from cifar.dataset import split_arrays

    history = fit(
        training_loop,
        {"dataset": dataset, "rounds": rounds, "batch_size": batch_size, "warmup_steps": 5},
        {"train": split_arrays(dataset, "train")},
        2,
        storage,
    )
    measured = [m for m in history if m["round"] >= 0]
    print(
        f"\nSmall CNN on 2 ranks, {batch_size} images a rank a step, "
        f"{measured[0]['memory_steps']} steps a pass, {rounds} rounds"
    )
    print(f"{'source':9s} {'step (median)':>14s} {'pass (median)':>14s}  step per round")
    for source in ("memory", "datasets"):
        step = statistics.median(m[f"{source}_step_s"] for m in measured)
        whole = statistics.median(m[f"{source}_pass_s"] for m in measured)
        per_round = " / ".join(f"{1000 * m[f'{source}_step_s']:.1f}" for m in measured)
        print(f"{source:9s} {1000 * step:11.1f} ms {whole:12.2f} s  {per_round} ms")
    ratios = [m["datasets_step_s"] / m["memory_step_s"] for m in measured]
    pass_ratios = [m["datasets_pass_s"] / m["memory_pass_s"] for m in measured]
    ratio = statistics.median(ratios)
    print(
        f"step datasets/memory, median of per-round ratios: {ratio:.3f}x "
        f"({min(ratios):.3f} to {max(ratios):.3f}); pass time: "
        f"{statistics.median(pass_ratios):.3f}x"
    )
    verdict = "met" if ratio <= 1.05 else "NOT met"
    print(f"target step through datasets= <= 1.05x in-memory: {ratio:.3f}x ({verdict})")


def measure_memory(small: Dataset, large: Dataset, scale: int, storage: str) -> None:
    from cifar.dataset import split_arrays

    print("\nRank peak RSS after one pass (1 rank, a fresh rank process each)")
    peaks = []
    for dataset in (small, large):
        (report,) = fit(memory_loop, {}, {"train": split_arrays(dataset, "train")}, 1, storage)
        peaks.append((report["peak_rss_mib"], report["hwm_mib"]))
        print(
            f"{report['rows']:>9,} rows: ru_maxrss {report['peak_rss_mib']:7.1f} MiB "
            f"(before the pass {report['peak_rss_before_mib']:.1f}); VmHWM "
            f"{report['hwm_mib']:7.1f} MiB (before the pass {report['hwm_before_mib']:.1f}, "
            f"RSS then {report['rss_before_mib']:.1f}); {report['images_per_s']:,.0f} images/s"
        )
    for index, measure in enumerate(("ru_maxrss", "VmHWM")):
        growth = peaks[1][index] / peaks[0][index] - 1
        verdict = "met" if growth <= 0.10 else "NOT met"
        print(
            f"target peak RSS growth <= 10% for {scale}x rows, {measure}: {100 * growth:+.1f}% "
            f"({verdict})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000, help="rows of the dataset")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds")
    parser.add_argument("--train-rows", type=int, default=10_000, help="rows for the CNN")
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--train-batch", type=int, default=128, help="images a rank a step")
    parser.add_argument("--scale", type=int, default=10, help="the memory test's growth")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=("throughput", "training", "memory")
    )
    parser.add_argument(
        "--sources", nargs="+", default=THROUGHPUT_SOURCES, choices=THROUGHPUT_SOURCES
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        started = time.perf_counter()
        dataset = write_dataset(os.path.join(tmp, "small"), args.rows)
        print(f"wrote {args.rows:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
        storage = os.path.join(tmp, "runs")
        if "throughput" not in args.skip:
            measure_throughput(dataset, args.rounds, tuple(args.sources), storage)
        if "training" not in args.skip:
            measure_training(
                first_files(dataset, args.train_rows), args.train_rounds, args.train_batch, storage
            )
        if "memory" not in args.skip:
            started = time.perf_counter()
            large = write_dataset(os.path.join(tmp, "large"), args.rows * args.scale)
            print(
                f"\nwrote {args.rows * args.scale:,} rows in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
            measure_memory(dataset, large, args.scale, storage)


if __name__ == "__main__":
    main()
