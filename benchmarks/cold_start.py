"""A user's first `train-cifar --synthetic --epochs 2`: wall time, training time, and where the
rest goes.

Each run starts in a fresh folder with a fresh PREFECT_HOME and MLflow store, no PREFECT_API_URL
(Prefect's local mode, as `make run-offline`), and the default LocalCluster. The phases come
from the run's own log file (`train-cifar.log`, millisecond timestamps) and the command's start
and end, measured here:

    start-up           command start -> first log line (imports, synthetic archive)
    prefect server     -> the flow run begins (waiting for Prefect's temporary server)
    download+preprocess  -> the dataset is written
    mlflow+cluster     -> the training run starts (MLflow store, cluster, workers)
    rank start         -> the first epoch begins (its end minus its duration)
    training           the epochs (their own durations)
    teardown           last epoch's end -> the training run has finished
    post-training      -> the flow run is Completed (register, evaluate, promote, summary)
    exit               -> the command has exited (Prefect server stop)

A new PREFECT_HOME's database is copied from the template the install made in the user's cache
(cli/database_template.py). With --no-template each run has an empty cache of its own: an
installation without `make`, whose first run has Prefect create and migrate the database.
With --returning, the runs share one PREFECT_HOME, made by an untimed run first: a returning
user's run, whose Prefect database exists.

With --compare CHECKOUT, the runs alternate between this checkout and another one (e.g. `git
worktree add /tmp/before HEAD~1`), and the medians of both are printed side by side.

Run: python benchmarks/cold_start.py [--runs 5] [--epochs 2] [--no-template | --returning]
     [--compare CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

PHASES = (
    "start-up",
    "prefect server",
    "download+preprocess",
    "mlflow+cluster",
    "rank start",
    "training",
    "teardown",
    "post-training",
    "exit",
)
_EPOCH = re.compile(r"epoch (\d+)/\d+: .*, ([\d.]+) s$")


def _stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _first(lines: list[str], needle: str) -> str:
    return next(line for line in lines if needle in line)


def phases(log: Path, started: float, ended: float) -> dict[str, float]:
    """The phases of one run from its log file and the command's start and end."""
    lines = [line for line in log.read_text().splitlines() if line[:4].isdigit()]
    epochs = [(_stamp(line), float(m.group(2))) for line in lines if (m := _EPOCH.search(line))]
    first_log = _stamp(lines[0])
    flow_begins = _stamp(_first(lines, "Beginning flow run"))
    dataset = _stamp(_first(lines, "tasks.preprocess: Wrote"))
    training_starts = _stamp(_first(lines, "controller: Run train-cifar-"))
    first_epoch_begins = epochs[0][0] - epochs[0][1]
    finished = _stamp(_first(lines, " finished"))
    completed = _stamp(_first(lines, "prefect.flow_runs: Finished in state Completed"))
    training = sum(seconds for _, seconds in epochs)
    last_epoch_ends = epochs[-1][0]
    return {
        "start-up": first_log - started,
        "prefect server": flow_begins - first_log,
        "download+preprocess": dataset - flow_begins,
        "mlflow+cluster": training_starts - dataset,
        "rank start": first_epoch_begins - training_starts,
        "training": training,
        "teardown": finished - last_epoch_ends,
        "post-training": completed - finished,
        "exit": ended - completed,
        "wall": ended - started,
        # between epochs: validation and checkpoints, part of neither training nor overhead
        "between epochs": (last_epoch_ends - first_epoch_begins) - training,
    }


REPOSITORY = Path(__file__).resolve().parent.parent


def cold_run(
    epochs: int, prefect_home: str | None = None, template: bool = True, code: Path = REPOSITORY
) -> dict[str, float]:
    """One run of the checkout ``code`` in a fresh folder; a fresh PREFECT_HOME there unless
    one is given."""
    with tempfile.TemporaryDirectory() as folder:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env["PYTHONPATH"] = str(code)  # its modules before the installed ones
        env["PREFECT_HOME"] = prefect_home or os.path.join(folder, "prefect-home")
        if not template:
            env["XDG_CACHE_HOME"] = os.path.join(folder, "empty-cache")
        command = [sys.executable, "-m", "cli.commands", "--synthetic", "--epochs", str(epochs)]
        started = time.time()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        ended = time.time()
        if done.returncode != 0:
            raise RuntimeError(f"train-cifar failed:\n{done.stderr[-3000:]}")
        return phases(Path(folder, "train-cifar.log"), started, ended)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--no-template", action="store_true", help="no database template")
    choice.add_argument("--returning", action="store_true", help="share one PREFECT_HOME")
    parser.add_argument("--compare", type=Path, help="another checkout, run alternately")
    args = parser.parse_args()
    checkouts = {"this": REPOSITORY, **({"other": args.compare} if args.compare else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory() as home:
        homes = {name: None if not args.returning else f"{home}/{name}" for name in checkouts}
        for name, code in checkouts.items():
            if args.returning:  # creates Prefect's database: not timed
                cold_run(args.epochs, homes[name], code=code)
        for index in range(args.runs):
            for name, code in checkouts.items():
                run = cold_run(args.epochs, homes[name], not args.no_template, code)
                runs[name].append(_timed(f"{name} {index + 1}", run))
    _print_medians(runs)


def _timed(label: str, run: dict[str, float]) -> dict[str, float]:
    print(
        f"run {label}: wall {run['wall']:.1f} s, training {run['training']:.1f} s, "
        f"overhead {run['wall'] - run['training']:.1f} s",
        flush=True,
    )
    return run


def _print_medians(runs: dict[str, list[dict[str, float]]]) -> None:
    names = list(runs)
    count = len(runs[names[0]])
    print(f"\nmedians over {count} runs each:\n")
    print("| phase | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for phase in (*PHASES, "between epochs", "wall"):
        cells = [f"{statistics.median(r[phase] for r in runs[n]):.1f}" for n in names]
        print(f"| {phase} | " + " | ".join(cells) + " |")
    overheads = [statistics.median(r["wall"] - r["training"] for r in runs[n]) for n in names]
    print("| **overhead** (wall - training) | " + " | ".join(f"**{o:.1f}**" for o in overheads))
    if len(names) == 2:
        walls = [statistics.median(r["wall"] for r in runs[n]) for n in names]
        print(f"\nwall, this / other: {walls[0] / walls[1]:.3f}")


if __name__ == "__main__":
    main()
