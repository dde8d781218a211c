"""torch.compile on the CPU: compile time and steady step of the pipeline's models.

One process (the thread count of one of 2 ranks on this machine, unless --threads), the
pipeline's model and its augmentation, SGD with momentum, a batch of synthetic CIFAR images;
eager and compiled alternate round by round, each round in a fresh process with an empty compile
cache (so every compiled round pays a cold compile, as on a new machine). The first step of a
compiled model includes compiling it.

Run: python benchmarks/compile.py [--model small_cnn] [--rounds 3] [--steps 60] [--batch 128]
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


def measure(
    model_name: str, compiled: bool, steps: int, batch: int, threads: int
) -> dict[str, float]:
    """First step and the median step after 10 warm-up steps, in seconds."""
    import torch
    from torch import nn

    from cifar.augment import augment
    from cifar.models import ModelSpec

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model: nn.Module = ModelSpec(model_name, (0.5,) * 3, (0.25,) * 3).build()
    if compiled:
        model = torch.compile(model)  # type: ignore[assignment]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        loss = nn.functional.cross_entropy(model(augment(images)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return {"first_s": times[0], "step_s": statistics.median(times[10:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=("eager", "compiled"))
    args = parser.parse_args()
    if args.child:
        figures = measure(
            args.model, args.child == "compiled", args.steps, args.batch, args.threads
        )
        print(json.dumps(figures))
        return
    results: dict[str, list[dict[str, float]]] = {"eager": [], "compiled": []}
    for round_index in range(args.rounds):
        order = ("eager", "compiled") if round_index % 2 == 0 else ("compiled", "eager")
        for mode in order:
            command = [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--model",
                args.model,
                "--steps",
                str(args.steps),
                "--batch",
                str(args.batch),
                "--threads",
                str(args.threads),
            ]
            with tempfile.TemporaryDirectory() as cache:  # a cold compile, as on a new machine
                environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                output = subprocess.run(
                    command, check=True, capture_output=True, text=True, env=environment
                ).stdout
            results[mode].append(json.loads(output.strip().splitlines()[-1]))
            print(f"round {round_index + 1} {mode}: {results[mode][-1]}", flush=True)
    eager = statistics.median(r["step_s"] for r in results["eager"])
    compiled = statistics.median(r["step_s"] for r in results["compiled"])
    first = statistics.median(r["first_s"] for r in results["compiled"])
    print(f"\n{args.model}, batch {args.batch}, {args.threads} thread(s), {args.rounds} rounds")
    print("| | first step | steady step (median) | vs eager |")
    print("|---|---|---|---|")
    eager_first = statistics.median(r["first_s"] for r in results["eager"])
    print(f"| eager | {eager_first:.2f} s | {eager * 1e3:.1f} ms | 1.00x |")
    print(f"| compiled | {first:.1f} s | {compiled * 1e3:.1f} ms | {compiled / eager:.2f}x |")


if __name__ == "__main__":
    main()
