"""benchmarks/gpu_check.py where there is no GPU (every machine here): the facts, then a clear
exit; its wheel list pinned as the project pins each package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_without_a_device_says_so_after_the_facts(tmp_path: Path) -> None:
    report = tmp_path / "gpu-check.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out", str(report)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "No CUDA device here: nothing more to check."
    written = report.read_text()
    assert written.startswith("# GPU check\n\n- torch ")
    assert "- CUDA devices: none (torch.cuda.is_available() is False)" in written


def test_gpu_check_wheels_are_pinned_as_the_project_pins_them() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = {*project["dependencies"], *project["optional-dependencies"]["dev"]}
    lines = (REPO / "benchmarks" / "gpu_check.txt").read_text().splitlines()
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert [w for w in wanted if w not in pinned] == []
