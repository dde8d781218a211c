"""How long a process that imported the pipeline takes to exit, with and without its heap
frozen (``gc.freeze()``, as the train-cifar command does before it exits).

Each sample is a fresh Python that imports the train-cifar flow (torch, Prefect, MLflow, Dask),
stamps the time, and exits; the figure is the parent's time from that stamp to the child's end.
The two modes alternate, so both see the same machine.

Run: python benchmarks/cli_exit.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

_CHILD = """
import gc, sys, time
import distributed
from flows.train_cifar import train_cifar
print(time.time(), flush=True)
if sys.argv[1] == "frozen":
    gc.freeze()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parents[1]
    exits: dict[str, list[float]] = {"plain": [], "frozen": []}
    for _ in range(args.runs):
        for mode, samples in exits.items():
            child = [sys.executable, "-c", _CHILD, mode]
            done = subprocess.run(child, cwd=repo, capture_output=True, text=True, check=True)
            samples.append(time.time() - float(done.stdout.split()[0]))
    for mode, samples in exits.items():
        runs = " / ".join(f"{s:.2f}" for s in samples)
        print(f"{mode}: exit median {statistics.median(samples):.2f} s ({runs})")


if __name__ == "__main__":
    main()
