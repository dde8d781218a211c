"""Training runs while checkpointing to S3: no checkpoints vs ``report(...,
checkpoint_upload_mode="sync")`` vs ``"async"``, side by side in one run.

One rank trains a small MLP (a step is ``--inner`` SGD steps) and carries a ``--state-mb``
buffer in its state dict, so every checkpoint (``torch.save`` into ``--local-dir``, a tmpfs by
default, then ``report``) is that large. Every ``--every`` steps, from step 0 on, it
checkpoints. One training run is one ``fit()`` of ``--steps`` steps in one mode; the modes
alternate within each round, on one warm Dask cluster
(``DaskConfig().connect(warm_ranks=True)``), against a SeaweedFS S3 server started here
(tests/s3_rig.py).

Figures: the run's wall time, from the rank's first step to ``fit()`` returning in the driver,
which comes after the last upload has finished and been committed (one machine, one clock);
and the median step (a step includes its checkpoint's ``torch.save`` and ``report()``). Both
as medians over the rounds, with their ratios to ``none``. Also the CPU seconds of the S3
server and of rank 0's upload helper process per run.

``--layout`` says who gets which CPU (the machine's CPUs, in order):

- ``all-cores`` (the default; what this benchmark ran before 2026-11-25): the rank trains
  with one torch thread per CPU, nothing pinned. The upload helper, the S3 server and the
  driver can only run on CPU time taken from training.
- ``spare-core``: a GPU host, where the rank's CPU thread drives the GPU and other cores idle.
  The rank trains on one torch thread, every thread of its process pinned to the first CPU;
  its upload helper process and the S3 server are pinned to the other CPUs. The upload gets a
  core of its own, as on such a host (there the S3 server is remote; here it shares the
  upload's core, the harder case). Other jobs on the machine are not pinned.

The torch thread count is set in the training function (``torch.set_num_threads``): a rank
forked from trainlib's fork server keeps the server's thread count (here 2) even when the
driver's environment has OMP_NUM_THREADS=1.

``--remote-like`` gives the S3 server the lowest CPU share (its autogroup at nice 19), as a
server on another machine would take none of ours.

Run: PYTHONPATH=. python benchmarks/checkpoint_upload.py [--layout spare-core] [--rounds 3]
[--steps 48] [--every 16] [--state-mb 256] [--inner 100] [--local-dir /dev/shm]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MODES = ("none", "sync", "async")
LAYOUTS = ("all-cores", "spare-core")


def _pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` (threads it starts later inherit the pin)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


def _children(pid: int) -> list[int]:
    """``pid``'s descendants (Linux /proc/PID/task/TID/children)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
    return found + [g for c in found for g in _children(c)]


def _cpu_s(pids: Iterable[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def _pin_helpers(cpus: set[int], stop: threading.Event) -> None:
    """In the rank: keep its child processes (the upload helper, started on the first async
    upload) on ``cpus``, this thread too; the rank's own threads are on the training CPU."""
    os.sched_setaffinity(0, cpus)
    while not stop.wait(0.1):
        for child in _children(os.getpid()):
            _pin(child, cpus)


def train(config: dict[str, Any]) -> None:
    import torch

    import trainlib

    torch.set_num_threads(config["threads"])
    mode = config["mode"]
    stop = threading.Event()
    if config["train_cpus"] is not None:
        _pin(os.getpid(), set(config["train_cpus"]))
        threading.Thread(
            target=_pin_helpers, args=(set(config["spare_cpus"]), stop), daemon=True
        ).start()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    state = torch.randn(config["state_mb"] * 2**20 // 4)  # float32: the checkpoint's bulk
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    first = time.time()
    for step in range(config["steps"]):
        started = time.perf_counter()
        for _ in range(config["inner"]):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        checkpoint = None
        if mode != "none" and step % config["every"] == 0:
            directory = tempfile.mkdtemp(dir=config["local_dir"])
            torch.save({"model": model.state_dict(), "state": state}, f"{directory}/ckpt.pt")
            checkpoint = trainlib.Checkpoint.from_directory(directory)
        trainlib.report(
            {"step": step, "first": first},
            checkpoint=checkpoint,
            checkpoint_upload_mode="sync" if mode == "none" else mode,
            delete_local_checkpoint_after_upload=True,
        )
        trainlib.report({"step_s": time.perf_counter() - started})
    stop.set()
    # the upload helper's CPU time so far; fit() returns after the last upload in any case
    trainlib.get_all_reported_checkpoints()
    trainlib.report({"helper_cpu_s": _cpu_s(_children(os.getpid()))})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=LAYOUTS, default="all-cores")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--every", type=int, default=16)
    parser.add_argument("--state-mb", type=int, default=256)
    parser.add_argument("--inner", type=int, default=100, help="SGD steps in one timed step")
    parser.add_argument(
        "--remote-like",
        action="store_true",
        help="give the S3 server the lowest CPU share, as if it ran elsewhere",
    )
    parser.add_argument(
        "--local-dir", default="/dev/shm", help="where the rank writes its checkpoints first"
    )
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"

    from tests.s3_rig import BUCKET, filesystem, seaweed_s3
    from trainlib import CheckpointConfig, DaskConfig, RunConfig, ScalingConfig
    from trainlib.torch import TorchTrainer

    cpus = sorted(os.sched_getaffinity(0))
    pinned = args.layout == "spare-core"
    if pinned and len(cpus) < 2:
        parser.error("--layout spare-core needs 2 CPUs or more")
    names = ("steps", "every", "state_mb", "inner", "local_dir")
    config: dict[str, Any] = {key: getattr(args, key) for key in names}
    config["train_cpus"] = cpus[:1] if pinned else None
    config["spare_cpus"] = cpus[1:]
    config["threads"] = 1 if pinned else len(cpus)
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    server_cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    helper_cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    load = [os.getloadavg()[0]]
    with (
        tempfile.TemporaryDirectory() as root,
        seaweed_s3(Path(root), remote_like=args.remote_like) as endpoint,
        DaskConfig().connect(num_workers=1, wait=True, warm_ranks=True) as client,
    ):
        storage = filesystem(endpoint, max_attempts=3)  # one for every fit
        server = next(
            p for p in _children(os.getpid()) if "weed" in Path(f"/proc/{p}/comm").read_text()
        )
        server_pids = [server, *_children(server)]
        if pinned:
            for pid in server_pids:
                _pin(pid, set(config["spare_cpus"]))
        for round_index in range(args.rounds):
            for mode in MODES:
                cpu_before = _cpu_s(server_pids)
                result = TorchTrainer(
                    train,
                    train_loop_config={**config, "mode": mode},
                    scaling_config=ScalingConfig(num_workers=1),
                    run_config=RunConfig(
                        name=f"upload-{round_index}-{mode}",
                        storage_path=f"s3://{BUCKET}/{uuid.uuid4().hex}",
                        storage_filesystem=storage,
                        checkpoint_config=CheckpointConfig(num_to_keep=2),
                    ),
                    client=client,
                ).fit()
                ended = time.time()
                history = result.metrics_history
                runs[mode].append(ended - history[0]["first"])
                steps[mode].extend(m["step_s"] for m in history if "step_s" in m)
                server_cpu[mode].append(_cpu_s(server_pids) - cpu_before)
                helper_cpu[mode].append(history[-1]["helper_cpu_s"])
                print(
                    f"round {round_index} {mode}: run {runs[mode][-1]:.2f} s, "
                    f"S3 server {server_cpu[mode][-1]:.1f} CPU s, "
                    f"upload helper {helper_cpu[mode][-1]:.1f} CPU s",
                    flush=True,
                )
    load.append(os.getloadavg()[0])
    run_base = statistics.median(runs["none"])
    step_base = statistics.median(steps["none"])
    print(
        f"layout {args.layout}: 1 rank, {config['threads']} torch thread(s), CPUs {cpus}"
        + (f", training on {config['train_cpus']}, upload + S3 on {cpus[1:]}" if pinned else "")
        + f"; {args.steps} steps, {args.state_mb} MB checkpoint every {args.every} steps from "
        f"step 0, written to {args.local_dir}; {args.rounds} rounds; "
        f"load average {load[0]:.2f} before, {load[1]:.2f} after"
    )
    print(
        "| mode | run (s) | vs none | median step (s) | vs none | runs (s) "
        "| S3 server CPU s / run | upload helper CPU s / run |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        run = statistics.median(runs[mode])
        step = statistics.median(steps[mode])
        print(
            f"| {mode} | {run:.2f} | {100 * (run / run_base - 1):+.1f} % | {step:.3f} | "
            f"{100 * (step / step_base - 1):+.1f} % | {', '.join(f'{r:.2f}' for r in runs[mode])} "
            f"| {statistics.median(server_cpu[mode]):.1f} "
            f"| {statistics.median(helper_cpu[mode]):.1f} |"
        )
    for mode in MODES:
        print(mode, "steps (s):", " ".join(f"{t:.2f}" for t in steps[mode]))


if __name__ == "__main__":
    main()
