"""How long a cold `train-cifar` waits for Prefect's temporary server: seconds from the
command's start to the server's launch, to the command being ready for it (imports and the
synthetic archive done), and to the server answering.

Each run: `train-cifar --synthetic --epochs 1` in a fresh folder with a fresh PREFECT_HOME, in
a process of its own, with LocalPrefectServer's start() and use() timed.

Run: python benchmarks/server_wait.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_RUN = """
import sys, time
started = time.perf_counter()
from cli import commands as cli
from cli import local_server

server_class = local_server.LocalPrefectServer
start, use = server_class.start.__func__, server_class.use
marks = {}

def timed_start(cls):
    server = start(cls)
    marks["launched"] = time.perf_counter() - started
    return server

def timed_use(self):
    marks["ready"] = time.perf_counter() - started
    use(self)
    marks["answered"] = time.perf_counter() - started

server_class.start = classmethod(timed_start)
server_class.use = timed_use
status = cli.main(["--synthetic", "--epochs", "1"])
print("MARKS", marks["launched"], marks["ready"], marks["answered"], status, file=sys.stderr)
"""


def one_run() -> tuple[float, float, float]:
    """Seconds from the command's start to the launch, to ready, to the server answering."""
    with tempfile.TemporaryDirectory() as folder:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env |= {"PREFECT_HOME": os.path.join(folder, "prefect-home"), "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "-c", _RUN], cwd=folder, env=env, capture_output=True, text=True
        )
    line = next((x for x in done.stderr.splitlines() if x.startswith("MARKS")), None)
    if line is None or not line.endswith(" 0"):
        raise RuntimeError(f"train-cifar failed:\n{done.stderr[-3000:]}")
    launched, ready, answered = (float(x) for x in line.split()[1:4])
    return launched, ready, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for index in range(args.runs):
        launched, ready, answered = one_run()
        print(
            f"run {index + 1}: server launched {launched:.2f} s, command ready {ready:.2f} s, "
            f"server answered {answered:.2f} s: waited {answered - ready:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
