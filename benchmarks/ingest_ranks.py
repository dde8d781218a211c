"""What benchmarks/ingest.py runs inside the rank processes: its three training functions
(throughput, training, memory) and the sources and measures they use.

The rank processes import this module by name: ``benchmarks/ingest.py`` puts this folder on
their PYTHONPATH.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from cifar.dataset import Dataset

BATCH_SIZE = 256
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


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
    rows, seconds, _ = timed_pass(
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
