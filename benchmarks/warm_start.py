"""Time from ``fit()`` to the first report, first and later fits on one Dask client.

Two ways of getting the cluster, alternating round by round: the user's own
``LocalCluster(n_workers=2)`` passed as ``client=``, and ``DaskConfig().connect(num_workers=2,
warm_ranks=True)``. Each round makes a new cluster and runs ``--fits`` fits of a 2-rank
function that reports at once; the latency is the rank's clock at its first report minus the
driver's at ``fit()`` (one machine, one clock). Fits after the first are "warm".

Run: python benchmarks/warm_start.py [--rounds 3] [--fits 4]
Target (issue 27): a warm fit reaches its first report in <= 0.5 s, whoever made the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator

from distributed import Client, LocalCluster

import trainlib
from trainlib import DaskConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer


def report_now(config: dict[str, float]) -> None:
    trainlib.report({"at": time.time()})


@contextlib.contextmanager
def _cluster(kind: str) -> Iterator[Client]:
    if kind == "own LocalCluster":
        with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
            yield c
    else:
        with DaskConfig().connect(num_workers=2, wait=True, warm_ranks=True) as c:
            yield c


def _fits(kind: str, fits: int, storage: str) -> list[float]:
    latencies = []
    with _cluster(kind) as client:
        for _ in range(fits):
            started = time.time()
            result = TorchTrainer(
                report_now,
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(storage_path=storage),
                client=client,
            ).fit()
            latencies.append(result.metrics["at"] - started)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fits", type=int, default=4)
    args = parser.parse_args()
    kinds = ("own LocalCluster", "DaskConfig.connect(warm_ranks=True)")
    first: dict[str, list[float]] = {k: [] for k in kinds}
    warm: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as storage:
        for round_ in range(args.rounds):
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                latencies = _fits(kind, args.fits, storage)
                first[kind].append(latencies[0])
                warm[kind].extend(latencies[1:])
                print(f"round {round_ + 1}, {kind}: " + ", ".join(f"{x:.3f}" for x in latencies))
    print("\n| cluster | first fit | later fits (median) | later fits (max) |")
    print("|---|---|---|---|")
    for kind in kinds:
        print(
            f"| {kind} | {statistics.median(first[kind]):.2f} s | "
            f"**{statistics.median(warm[kind]):.3f} s** | {max(warm[kind]):.3f} s |"
        )


if __name__ == "__main__":
    main()
