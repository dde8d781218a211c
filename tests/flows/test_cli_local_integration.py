"""`make run-offline` as a new user runs it: no PREFECT_API_URL, a new PREFECT_HOME, a new
folder. The command starts Prefect's temporary server itself (flows/local_server.py), records
its flow run there, and leaves no server behind."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def _train_cifar(folder: Path, home: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``train-cifar --synthetic --epochs 1`` in ``folder``: no PREFECT_API_URL, ``home`` as
    PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {"PREFECT_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "--synthetic", "--epochs", "1"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_train_cifar_runs_on_prefects_temporary_server(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    done = _train_cifar(tmp_path, home, timeout_s=240)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["model_version"] == "1" and summary["alias"] == "champion"
    with sqlite3.connect(home / "prefect.db") as db:
        runs = db.execute(
            "SELECT flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = "
            "flow_run.flow_id"
        ).fetchall()
    assert runs == [("train-cifar", "COMPLETED")]
    output = done.stdout + done.stderr
    for unwanted in ("Traceback", "Error logging to API", "View at"):
        assert unwanted not in output, output
    assert _servers_of(home) == []


def test_train_cifar_explains_a_temporary_server_that_cannot_start(tmp_path: Path) -> None:
    """A damaged database in PREFECT_HOME: one paragraph naming it, at once (uvicorn's exit
    status 3 is not taken for a port in use), no server left, nothing trained."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    (home / "prefect.db").write_text("not a database")
    done = _train_cifar(tmp_path, home, timeout_s=60)  # the startup timeout is 90 s
    assert done.returncode == 1
    paragraph = done.stderr.strip().splitlines()[-1]
    assert paragraph.startswith("Prefect's temporary server exited with status 3"), paragraph
    assert f"If its database in {home} is damaged, move that folder away" in paragraph
    assert "Traceback" not in paragraph
    assert _servers_of(home) == []
    assert not (tmp_path / "cifar-data" / "datasets").exists()


def _servers_of(home: Path) -> list[int]:
    """Prefect servers (uvicorn serving create_app) still running on ``home``."""
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        cmdline, environ = process.info["cmdline"] or [], process.info["environ"] or {}
        serving = any("prefect.server.api.server:create_app" in part for part in cmdline)
        if serving and environ.get("PREFECT_HOME") == str(home):
            found.append(process.pid)
    return found
