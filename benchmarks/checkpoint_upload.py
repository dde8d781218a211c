"""Step time while checkpointing to S3: no checkpoints vs ``report(..., checkpoint_upload_mode=
"sync")`` vs ``"async"``, side by side in one run.

One rank trains a small MLP (a step is a fixed number of SGD steps on one thread) and carries a
``--state-mb`` buffer in its state dict, so every checkpoint (``torch.save`` of the state
dict into ``--local-dir``, a tmpfs by default, then ``report``) is that large. Every
``--every`` steps it checkpoints. The three modes
alternate within each round, all in the same training function, against a SeaweedFS S3 server
started here (tests/trainlib/s3_rig.py); ``--remote-like`` gives it the lowest CPU share (its
autogroup at nice 19), as a server on another machine would take none of ours. The rank uses
one thread (OMP_NUM_THREADS=1): on a 2-core machine the other core serves the upload and the
S3 server.

A step's time includes the checkpoint's ``torch.save`` and ``report()``. After each mode's
steps the rank waits for its last upload (``get_all_reported_checkpoints()``), so that no
upload overlaps the next mode's steps; that wait counts in the mode's time. The figure is the
mode's time per step (steps and wait over the number of steps), and its ratio to ``none``.

Run: PYTHONPATH=. python benchmarks/checkpoint_upload.py [--rounds 2] [--steps 16]
[--every 16] [--state-mb 256] [--inner 100] [--local-dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

MODES = ("none", "sync", "async")


def train(config: dict[str, Any]) -> None:
    import torch

    import trainlib

    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    state = torch.randn(config["state_mb"] * 2**20 // 4)  # float32: the checkpoint's bulk
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    for round_index in range(config["rounds"]):
        for mode in MODES:
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
                    torch.save(
                        {"model": model.state_dict(), "state": state}, f"{directory}/ckpt.pt"
                    )
                    checkpoint = trainlib.Checkpoint.from_directory(directory)
                trainlib.report(
                    {"round": round_index, "mode": mode, "step": step},
                    checkpoint=checkpoint,
                    checkpoint_upload_mode="sync" if mode == "none" else mode,
                    delete_local_checkpoint_after_upload=True,
                )
                trainlib.report({"mode": mode, "step_s": time.perf_counter() - started})
            waited = time.perf_counter()
            trainlib.get_all_reported_checkpoints()  # the last upload, before the next mode
            trainlib.report({"mode": mode, "wait_s": time.perf_counter() - waited})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
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

    from tests.trainlib.s3_rig import BUCKET, filesystem, seaweed_s3
    from trainlib import CheckpointConfig, RunConfig, ScalingConfig
    from trainlib.torch import TorchTrainer

    names = ("rounds", "steps", "every", "state_mb", "inner", "local_dir")
    config = {key: getattr(args, key) for key in names}
    with (
        tempfile.TemporaryDirectory() as root,
        seaweed_s3(Path(root), remote_like=args.remote_like) as endpoint,
    ):
        result = TorchTrainer(
            train,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(
                name="upload",
                storage_path=f"s3://{BUCKET}/{uuid.uuid4().hex}",
                storage_filesystem=filesystem(endpoint, max_attempts=3),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
        ).fit()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    waits: dict[str, list[float]] = {mode: [] for mode in MODES}
    for entry in result.metrics_history:
        if "step_s" in entry:
            times[entry["mode"]].append(entry["step_s"])
        if "wait_s" in entry:
            waits[entry["mode"]].append(entry["wait_s"])
    per_step = {m: (sum(times[m]) + sum(waits[m])) / len(times[m]) for m in MODES}
    base = per_step["none"]
    print(
        f"checkpoint {args.state_mb} MB every {args.every} steps, written to {args.local_dir}, "
        f"{args.rounds} rounds"
    )
    print("| mode | time per step (s) | vs none | median step (s) | max step (s) | end wait (s) |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        print(
            f"| {mode} | {per_step[mode]:.3f} | {100 * (per_step[mode] / base - 1):+.1f} % | "
            f"{statistics.median(times[mode]):.3f} | {max(times[mode]):.3f} | "
            f"{', '.join(f'{w:.2f}' for w in waits[mode])} |"
        )
    for mode in MODES:
        print(mode, "steps (s):", " ".join(f"{t:.2f}" for t in times[mode]))


if __name__ == "__main__":
    main()
