"""trainlib's overhead against torchrun: start-up and steady-state step time.

One training script (a small CNN on synthetic CIFAR-shaped data, a fixed number of SGD steps,
global batch 128) runs three ways, alternating, for several rounds:

- ``single``: one process, batch 128 (a reference, not a target);
- ``torchrun``: ``torchrun --standalone --nproc_per_node=2``, batch 64 per rank, gloo DDP;
- ``trainlib``: ``TorchTrainer`` with 2 workers on its default LocalCluster, batch 64 per rank.

Start-up is measured from just before the launcher process is started to the first training
step of rank 0; the steady-state step time is the median step time after the warm-up steps.
Also measured: the launcher's CPU (torchrun's agent; trainlib's driver, whose event loop runs
the Dask scheduler and workers) while the ranks take those steps, in % of one core: on a
machine whose cores the ranks fill, what the launcher takes comes out of their steps.
Targets: trainlib step time <= 1.03x torchrun's; start-up <= torchrun's + 3 s.

Run: python benchmarks/overhead.py [--rounds 5] [--steps 60] [--warmup 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

GLOBAL_BATCH = 128
MODES = ("single", "torchrun", "trainlib")


# --- the training script ------------------------------------------------------------------


def train_steps(world_size: int, rank: int, steps: int, out: str) -> None:
    """Run ``steps`` SGD steps of a small CNN; rank 0 writes its timings to ``out``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 10),
    )
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = GLOBAL_BATCH // world_size
    images, labels = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    first_step_at, step_s = 0.0, []
    launcher, launcher_cpu = (_launcher() if world_size > 1 else None), []
    for step in range(steps):
        if step == 0:
            first_step_at = time.time()
        if step in (min(10, steps - 1), steps - 1) and launcher is not None:
            launcher_cpu.append((time.monotonic(), _cpu_seconds(launcher)))
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_s.append(time.perf_counter() - start)
    if rank == 0:
        figures: dict[str, Any] = {"first_step_at": first_step_at, "step_s": step_s}
        if len(launcher_cpu) == 2:
            (began, cpu_began), (ended, cpu_ended) = launcher_cpu
            figures["launcher_core_share"] = (cpu_ended - cpu_began) / (ended - began)
        with open(out, "w") as f:
            json.dump(figures, f)


def _launcher() -> Any:
    """The process that launched this rank (torchrun's agent, or the driver whose Dask workers
    started it), found as the nearest ancestor running this script; None as a single process."""
    import psutil

    for process in psutil.Process().parents():
        if any(os.path.basename(__file__) in part for part in process.cmdline()):
            return process
    return None


def _cpu_seconds(process: Any) -> float:
    """CPU time of the launcher with all its threads (the ranks are other processes)."""
    times = process.cpu_times()
    return float(times.user + times.system)


def run_torchrun(steps: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    train_steps(dist.get_world_size(), dist.get_rank(), steps, out)
    dist.barrier()  # as trainlib does: without it gloo's teardown aborted now and then
    dist.destroy_process_group()


def trainlib_train_func(config: dict[str, Any]) -> None:
    import trainlib

    context = trainlib.get_context()
    train_steps(context.get_world_size(), context.get_world_rank(), config["steps"], config["out"])


def run_trainlib(steps: int, out: str) -> None:
    from trainlib import RunConfig, ScalingConfig
    from trainlib.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as storage:
        TorchTrainer(
            trainlib_train_func,
            train_loop_config={"steps": steps, "out": out},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=storage),
        ).fit()


# --- the harness ---------------------------------------------------------------------------


def launch(mode: str, steps: int, out: str, attempts: int = 3) -> float:
    """Run one mode in a fresh process; return the wall-clock time at launch.

    A failed launch is reported and retried (torchrun's rank 0 aborted now and then here).
    """
    script = [os.path.abspath(__file__), "--mode", mode, "--steps", str(steps), "--out", out]
    if mode == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            *script,
        ]
    else:
        command = [sys.executable, *script]
    for attempt in range(1, attempts + 1):
        launched_at = time.time()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode == 0:
            return launched_at
        last_lines = " | ".join(done.stderr.strip().splitlines()[-3:])
        print(f"{mode} run failed (attempt {attempt}, exit {done.returncode}): {last_lines}")
    raise RuntimeError(f"{mode} failed {attempts} times; see the lines above.")


def measure(rounds: int, steps: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {m: {"startup_s": [], "step_s": []} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            for mode in MODES:
                out = os.path.join(tmp, f"{mode}-{round_index}.json")
                launched_at = launch(mode, steps, out)
                with open(out) as f:
                    timings = json.load(f)
                figures[mode]["startup_s"].append(timings["first_step_at"] - launched_at)
                figures[mode]["step_s"].append(statistics.median(timings["step_s"][warmup:]))
                if "launcher_core_share" in timings:
                    figures[mode].setdefault("launcher_cpu", []).append(
                        timings["launcher_core_share"]
                    )
                print(
                    f"round {round_index + 1}/{rounds} {mode:9s} "
                    f"startup {figures[mode]['startup_s'][-1]:6.2f} s  "
                    f"step {1000 * figures[mode]['step_s'][-1]:6.1f} ms",
                    flush=True,
                )
    return figures


def report(figures: dict[str, dict[str, list[float]]]) -> None:
    medians = {m: {k: statistics.median(v) for k, v in f.items()} for m, f in figures.items()}
    base = medians["torchrun"]
    print(
        f"\n{'mode':9s} {'startup (median)':>17s} {'step (median)':>14s} {'step / torchrun':>16s}"
        f" {'launcher CPU':>13s}"
    )
    for mode, m in medians.items():
        launcher = f"{100 * m['launcher_cpu']:11.1f} %" if "launcher_cpu" in m else ""
        print(
            f"{mode:9s} {m['startup_s']:15.2f} s {1000 * m['step_s']:11.1f} ms "
            f"{m['step_s'] / base['step_s']:15.3f}x {launcher}"
        )
    print("(launcher CPU: its CPU time while rank 0 took its steps after the 10th, % of one core)")
    paired = [
        t / r
        for t, r in zip(figures["trainlib"]["step_s"], figures["torchrun"]["step_s"], strict=True)
    ]
    print(
        f"\nmedian of per-round step-time ratios trainlib/torchrun: "
        f"{statistics.median(paired):.3f}x (min {min(paired):.3f}, max {max(paired):.3f})"
    )
    step_ratio = medians["trainlib"]["step_s"] / base["step_s"]
    startup_delta = medians["trainlib"]["startup_s"] - base["startup_s"]
    print(
        f"\ntrainlib vs torchrun: step time {step_ratio:.3f}x (target <= 1.03x), "
        f"start-up {startup_delta:+.2f} s (target <= +3 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "single":
        train_steps(1, 0, args.steps, args.out)
    elif args.mode == "torchrun":
        run_torchrun(args.steps, args.out)
    elif args.mode == "trainlib":
        run_trainlib(args.steps, args.out)
    else:
        report(measure(args.rounds, args.steps, args.warmup))


if __name__ == "__main__":
    main()
