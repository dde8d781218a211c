"""Chaos: runs with a random rank or Dask worker killed at a random moment.

Each run trains a small model for a fixed number of steps on 2 ranks (a LocalCluster of 2
nanny-supervised worker processes, FailureConfig(max_failures=-1)), checkpointing every few
steps. A killer thread SIGKILLs, at a random moment, either a random rank process or a random
Dask worker process. Printed per run and in total: completed runs, restarts, work lost (steps
trained beyond the last checkpoint, so trained twice), corrupt checkpoints loaded (a loaded
checkpoint whose weights do not match the digest saved with them; must be 0), and orphan rank
processes left after the run (must be 0), and recovery time (from the kill to the first training
step of the restarted group; target: under 15 s plus start-up).

Run: python benchmarks/chaos.py [--runs 20] [--steps 60] [--every 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil


def _digest(state: dict[str, Any]) -> str:
    import torch

    return hashlib.sha256(
        b"".join(t.numpy().tobytes() for t in state.values() if isinstance(t, torch.Tensor))
    ).hexdigest()


def train_func(config: dict[str, Any]) -> None:
    import torch

    import trainlib
    from trainlib.torch import prepare_model

    rank = trainlib.get_context().get_world_rank()
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    plain = model.module if hasattr(model, "module") else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        if _digest(state["model"]) != state["digest"] and rank == 0:
            with open(Path(config["log_dir"], "corrupt"), "a") as f:
                f.write("1\n")
        plain.load_state_dict(state["model"])
        start = state["step"] + 1
    if rank == 0:
        with open(Path(config["log_dir"], "steps"), "a") as f:
            f.write(f"start {start} {time.time()}\n")
    for step in range(start, config["steps"]):
        x = torch.randn(256, 64)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(config["step_s"])  # stands for a heavier step
        if rank == 0:
            with open(Path(config["log_dir"], "steps"), "a") as f:
                f.write(f"step {step} {time.time()}\n")
        if step % config["every"] == config["every"] - 1 or step == config["steps"] - 1:
            with tempfile.TemporaryDirectory() as directory:
                if rank == 0:
                    weights = {k: v.clone() for k, v in plain.state_dict().items()}
                    torch.save(
                        {"model": weights, "step": step, "digest": _digest(weights)},
                        os.path.join(directory, "state.pt"),
                    )
                trainlib.report(
                    {"step": step}, checkpoint=trainlib.Checkpoint.from_directory(directory)
                )


def _rank_pids() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "trainlib._internal.rank.rank_main" in " ".join(p.info["cmdline"] or [])
    ]


def _kill_later(client: Any, delay_s: float, rng: random.Random, log: list[Any]) -> None:
    time.sleep(delay_s)
    if rng.random() < 0.5:
        pids = _rank_pids()
        if pids:
            os.kill(rng.choice(pids), signal.SIGKILL)
            log.extend(["rank", time.time()])
            return
    pids = list(client.run(os.getpid).values())
    os.kill(rng.choice(pids), signal.SIGKILL)
    log.extend(["worker", time.time()])


def _recovery_s(lines: list[str], killed_at: float) -> float | None:
    """Seconds from the kill to the first step of the next attempt, or None without one."""
    restarted = False
    for line in lines:
        kind, at = line.split()[0], float(line.split()[-1])
        if kind == "start" and at > killed_at:
            restarted = True
        elif restarted and kind == "step":
            return at - killed_at
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    from trainlib import FailureConfig, RunConfig, ScalingConfig
    from trainlib.torch import TorchTrainer

    rng = random.Random(args.seed)
    totals = {"completed": 0, "restarts": 0, "lost": 0, "corrupt": 0, "orphans": 0}
    recoveries: list[float] = []
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for run in range(args.runs):
            log_dir = Path(tmp, f"log{run}")
            log_dir.mkdir()
            kills: list[Any] = []
            killer = threading.Thread(
                target=_kill_later, args=(client, rng.uniform(2.0, 6.0), rng, kills)
            )
            killer.start()
            result = TorchTrainer(
                train_func,
                train_loop_config={
                    "steps": args.steps,
                    "every": args.every,
                    "step_s": args.step_s,
                    "log_dir": str(log_dir),
                },
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(
                    name=f"chaos{run}",
                    storage_path=tmp,
                    failure_config=FailureConfig(max_failures=-1),
                ),
                client=client,
            ).fit()
            killer.join()
            lines = (log_dir / "steps").read_text().splitlines()
            trained = sum(line.startswith("step") for line in lines)
            recovery = _recovery_s(lines, kills[1]) if kills else None
            if recovery is not None:
                recoveries.append(recovery)
            corrupt = (
                len((log_dir / "corrupt").read_text().split())
                if (log_dir / "corrupt").exists()
                else 0
            )
            orphans = len(_rank_pids())
            completed = result.metrics.get("step") == args.steps - 1
            totals["completed"] += completed
            totals["restarts"] += result.num_restarts
            totals["lost"] += trained - args.steps
            totals["corrupt"] += corrupt
            totals["orphans"] += orphans
            print(
                f"run {run + 1:2d}: killed {kills[0] if kills else 'nothing (run ended)':6s} "
                f"completed={completed} restarts={result.num_restarts} "
                f"steps lost={trained - args.steps} corrupt loaded={corrupt} "
                f"orphans={orphans} recovery="
                f"{'-' if recovery is None else f'{recovery:.1f} s'}",
                flush=True,
            )
            client.wait_for_workers(2, timeout=60)  # the nanny restarts a killed worker
    print(
        f"\n{totals['completed']}/{args.runs} runs completed, {totals['restarts']} restarts, "
        f"{totals['lost']} steps lost (trained twice) of {args.runs * args.steps}, "
        f"{totals['corrupt']} corrupt checkpoints loaded, {totals['orphans']} orphan ranks"
    )
    if recoveries:
        print(
            f"recovery from kill to training again: median {statistics.median(recoveries):.1f} s,"
            f" max {max(recoveries):.1f} s over {len(recoveries)} restarts"
        )


if __name__ == "__main__":
    main()
