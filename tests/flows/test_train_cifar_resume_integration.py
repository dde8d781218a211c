"""The driver dies mid-training; the same flow run again resumes the same training run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.settings import PREFECT_API_URL

from cifar.format import write_synthetic_archive
from mlops.tracking import TRAINING_RUN_TAG
from tests.conftest import HttpDir
from tests.helpers import rank_processes, wait_for_path
from trainlib._internal.common.commit_marker import COMMIT_MARKER

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

EPOCHS = 4
RUN = "resumable"
RANKS_EXIT_S = 30.0


def _command(url: str, md5: str, root: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli.commands",
        "--data-url",
        url,
        "--data-md5",
        md5,
        "--storage-path",
        str(root / "store"),
        "--epochs",
        str(EPOCHS),
        "--batch-size",
        "64",
        "--rows-per-file",
        "250",
        "--run-name",
        RUN,
        "--registered-model-name",
        "resumed",
        "--mlflow-tracking-uri",
        f"sqlite:///{root}/mlflow.db",
    ]


def test_flow_resumes_after_driver_is_killed(
    prefect_server: None, http_dir: HttpDir, tmp_path: Path
) -> None:
    md5 = write_synthetic_archive(str(http_dir.path / "resume.tar.gz"), images_per_batch=200)
    command = _command(f"{http_dir.url}/resume.tar.gz", md5, tmp_path)
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    repo = Path(__file__).resolve().parents[2]
    driver = subprocess.Popen(
        command, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_path(
            tmp_path / "store" / "runs" / RUN / "checkpoint_000001" / COMMIT_MARKER, timeout_s=180
        )
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + RANKS_EXIT_S
    while rank_processes() and time.monotonic() < deadline:
        time.sleep(0.1)  # ranks notice their supervisor's connection closing and exit
    assert rank_processes() == []

    done = subprocess.run(
        command, env=env, cwd=repo, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "from Checkpoint(file://" in done.stderr  # trainlib: "starting ... from <ckpt>"

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("train-cifar")
    assert experiment is not None
    runs = [  # the training runs: each evaluation is a run nested under its training run
        r
        for r in client.search_runs([experiment.experiment_id])
        if "mlflow.parentRunId" not in r.data.tags
    ]
    assert [r.data.tags[TRAINING_RUN_TAG] for r in runs] == [RUN]
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_accuracy")]
    assert sorted(steps) == list(range(EPOCHS))
    assert runs[0].info.status == "FINISHED"
