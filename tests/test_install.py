"""The install the README's commands run: which torch build `make` asks pip for."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CU126 = "https://download.pytorch.org/whl/cu126"


def _torch_install(*variables: str) -> str:
    """The pip command that installs torch, as `make` would run it on a fresh .venv."""
    dry_run = subprocess.run(
        ["make", "--dry-run", "--always-make", ".venv/.installed", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    commands = dry_run.stdout.replace("\\\n", " ").splitlines()
    [command] = [c for c in commands if "pip install" in c and "torch==" in c]
    return " ".join(command.split())


def test_install_takes_torch_from_pypi_by_default() -> None:
    command = _torch_install()
    assert "torch==2.14.1 torchvision==0.29.1" in command
    assert "--index-url" not in command


def test_install_takes_torch_from_the_index_asked_for_older_gpus() -> None:
    command = _torch_install(f"TORCH_INDEX_URL={CU126}")
    assert command.endswith(f"torch==2.14.1 torchvision==0.29.1 --index-url {CU126}")
