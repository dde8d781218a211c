"""The GPU check: what a GPU host has, the GPU tests that need only trainlib's packages, and
trainlib against plain PyTorch on one GPU, for a bare GPU host (torch and torchvision, no
network, no Prefect, MLflow or S3), in under five minutes, writing its report as each step ends.

    python benchmarks/gpu_check.py [--out gpu-check.md] [--no-throughput]
    make gpu-check

The packages beyond torch and torchvision (benchmarks/gpu_check.txt) come from a folder of
wheels made where the package index is reachable, for the GPU host's Python and platform: all
of them are 72 MB (pyarrow 54, pandas 12), over one 64 MiB upload; a CUDA image that ships
pandas, pyarrow and pytest (most do) lacks about 3 MB (dask, distributed, tenacity and theirs),
so download with ``--no-deps`` only what ``pip list`` there lacks:

    pip download -d gpu-wheels --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 dask==2026.8.0 ...
    # on the GPU host, in a checkout with gpu-wheels/ beside it:
    pip install --no-index --no-deps --find-links gpu-wheels gpu-wheels/*.whl

Steps, each bounded and reported; the exit status is that of the first step that failed:
1. facts: torch, the CUDA and cuDNN it was built with, its arch list, each device (name,
   compute capability, memory, UUID, native bf16, whether the arch list covers it), and how
   trainlib discovers the devices (NVML, or the driver's /proc files where NVML is missing);
2. the GPU tests (``-m gpu``) of GPU_TESTS: placement on real devices, two runs on one GPU,
   the fork server never initialising CUDA while its forked ranks do, the rank's device, peer
   copies;
3. ``benchmarks/epoch_throughput.py --gpu``, one round of 3 epochs (the first left out), for
   small_cnn and resnet18, eager and compiled: the tables docs/benchmarks.md's GPU section
   takes.
Without a CUDA device it prints the facts and exits 2, saying so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# trainlib and cifar from this checkout, here and in the steps (a bare host installs neither)
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
GPU_TESTS = (
    "tests/trainlib/test_gpu_placement_integration.py",
    "tests/trainlib/test_torch_train_loop.py",
    "tests/trainlib/_internal/rank/test_transfer.py",
)
THROUGHPUT = [
    (model, compiled) for model in ("small_cnn", "resnet18") for compiled in (False, True)
]
NO_DEVICE = 2
# Bounds, within five minutes in all (the facts take seconds): each step's, and the whole.
BUDGET_S = 285.0
TESTS_S = 90.0
THROUGHPUT_S = {False: 40.0, True: 55.0}  # eager, compiled: 4 runs of 3 epochs in all


def facts() -> list[str]:
    """What this host has, one line each."""
    import torch

    lines = [
        f"torch {torch.__version__}, built with CUDA {torch.version.cuda}, "
        f"cuDNN {torch.backends.cudnn.version()}"
    ]
    if not torch.cuda.is_available():
        return [*lines, "CUDA devices: none (torch.cuda.is_available() is False)"]
    arches = torch.cuda.get_arch_list()
    lines.append(f"arch list: {' '.join(arches)}")
    for index in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(index)
        arch = f"sm_{p.major}{p.minor}"
        lines.append(
            f"GPU {index}: {p.name}, {arch}, {p.total_memory / 2**30:.0f} GiB, GPU-{p.uuid}, "
            f"native bf16 {torch.cuda.is_bf16_supported(including_emulation=False)}, "
            f"in the arch list {arch in arches}"
        )
    from trainlib._internal.common import gpu_discovery

    nvml = gpu_discovery.nvml_devices()
    how = "NVML" if nvml is not None else "the driver's /proc files (NVML missing)"
    lines.append(
        f"trainlib's discovery: {how}; a worker's view: {gpu_discovery.probe_worker_devices()}"
    )
    return lines


def step(name: str, command: list[str], bound_s: float, deadline: float) -> tuple[int, str]:
    """Run one step within its bound and the check's deadline; its exit status and output (a
    step past either: status 124)."""
    print(f"\n## {name}\n$ {' '.join(command)}", flush=True)
    began = time.monotonic()
    timeout_s = max(1.0, min(bound_s, deadline - began))
    try:
        done = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        status, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        partial = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part or ""
            for part in (expired.stdout, expired.stderr)
        )
        status, output = 124, f"{partial}\n(over {timeout_s:.0f} s)"
    print(output[-6000:], flush=True)
    print(f"({name}: exit status {status}, {time.monotonic() - began:.0f} s)", flush=True)
    return status, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report (markdown) here, step by step")
    parser.add_argument("--no-throughput", action="store_true", help="facts and tests only")
    args = parser.parse_args()
    report = Report(args.out)
    report.add("# GPU check", "", *(f"- {line}" for line in facts()))
    import torch

    if not torch.cuda.is_available():
        print("\nNo CUDA device here: nothing more to check.", file=sys.stderr)
        sys.exit(NO_DEVICE)
    deadline = time.monotonic() + BUDGET_S
    statuses = []
    tests = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    status, output = step("GPU tests", [*tests, *GPU_TESTS], TESTS_S, deadline)
    statuses.append(status)
    report.add("", "## GPU tests", "", "```", *output.strip().splitlines()[-15:], "```")
    if not args.no_throughput:
        report.add("", "## trainlib against plain PyTorch, one GPU")
        for model, compiled in THROUGHPUT:
            command = [
                sys.executable, "benchmarks/epoch_throughput.py", "--gpu", "--model", model,
                "--rounds", "1", "--epochs", "3", *(["--compile"] if compiled else []),
            ]  # fmt: skip
            name = f"{model}, compile {'on' if compiled else 'off'}"
            status, output = step(name, command, THROUGHPUT_S[compiled], deadline)
            statuses.append(status)
            table = [line for line in output.splitlines() if line.startswith(("|", "trainlib /"))]
            report.add("", f"{name}: exit status {status}", "", *table)
    sys.exit(next((s for s in statuses if s != 0), 0))


class Report:
    """The markdown report, printed and appended to ``path`` as each part ends: a run killed
    midway keeps what it did."""

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None
        if self._path is not None:
            self._path.write_text("")

    def add(self, *lines: str) -> None:
        text = "\n".join(lines) + "\n"
        print(text, end="", flush=True)
        if self._path is not None:
            with self._path.open("a") as out:
                out.write(text)


if __name__ == "__main__":
    main()
