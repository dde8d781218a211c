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
(the training functions, run inside the ranks: benchmarks/ingest_ranks.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from ingest_ranks import BATCH_SIZE, MEAN, STD, memory_loop, throughput_loop, training_loop

from cifar.dataset import DataFile, Dataset, Manifest

ROWS_PER_FILE = 2500  # the pipeline's default shard size
THROUGHPUT_SOURCES = ("transform", "arrays", "dataloader", "memory", "cached")
# The rank processes import the training functions from ingest_ranks.py, beside this file.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, (os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")))
)


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
