"""train-cifar on a real SLURM cluster (tests/slurm_rig.py) through dask-jobqueue: every Dask
step and every rank runs inside a SLURM batch job, and nothing is left afterwards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tests.slurm_probe
from cifar.format import write_synthetic_archive
from cli.commands import main
from tests.prefect_stack import REPO
from tests.slurm_probe import PROBE_DIR, tasks_by_job
from tests.slurm_rig import SlurmCluster


def test_train_cifar_cli_runs_every_step_in_slurm_jobs(
    slurm: SlurmCluster,
    prefect_server: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive = tmp_path / "cifar-10-python.tar.gz"
    md5 = write_synthetic_archive(str(archive), images_per_batch=200)
    probe = tmp_path / "probe"
    probe.mkdir()
    # Every Dask worker (started inside its SLURM job) records the tasks it ran.
    monkeypatch.setenv(
        "DASK_DISTRIBUTED__WORKER__PRELOAD", json.dumps([tests.slurm_probe.__file__])
    )
    monkeypatch.setenv(PROBE_DIR, str(probe))
    # The jobs run in the submitting directory (tmp_path): they import this checkout's code.
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts land here
    monkeypatch.setenv("CIFAR_LOG_FILE", str(tmp_path / "train-cifar.log"))
    cluster_kwargs = {
        "cores": 1,
        "processes": 1,
        "memory": "1GB",
        "walltime": "00:10:00",
        "interface": "lo",
        "local_directory": str(tmp_path / "dask"),
        "log_directory": str(tmp_path / "jobs"),
    }
    status = main(
        [
            "--data-url",
            archive.as_uri(),
            "--data-md5",
            md5,
            "--storage-path",
            str(tmp_path / "store"),
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--num-workers",
            "2",
            "--rows-per-file",
            "250",
            "--mlflow-tracking-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
            "--registered-model-name",
            "slurm-e2e",
            "--dask-cluster-class",
            "dask_jobqueue.SLURMCluster",
            "--dask-cluster-kwargs",
            json.dumps(cluster_kwargs),
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    summary = json.loads(out[out.index("{") :])
    assert (summary["model_version"], summary["promoted"]) == ("1", True)
    # One epoch learns the synthetic classes' patterns: 0.71 on the test split here (2 runs;
    # seeded, so every run alike). Chance is 0.1.
    assert summary["test_accuracy"] > 0.4

    # Preprocessing: each Parquet file was written by a task that ran in a SLURM job.
    ran = tasks_by_job(probe)
    written = {job: [k for k in keys if "write_file" in k] for job, keys in ran.items()}
    parquet_files = list((tmp_path / "store").rglob("*.parquet"))
    assert parquet_files
    assert sum(len(keys) for keys in written.values()) == len(parquet_files)
    assert all(job.isdigit() for job, keys in written.items() if keys), written

    # Training: both ranks said which SLURM job they run in (their own environment), and
    # those are the jobs whose workers ran the preprocessing.
    log = (tmp_path / "train-cifar.log").read_text()
    placed = dict(
        re.findall(r"Joined the group: rank (\d) on \S+ \(pid \d+, SLURM job (\d+)\)", log)
    )
    assert sorted(placed) == ["0", "1"], log[-3000:]
    assert set(placed.values()) <= set(ran), (placed, sorted(ran))
    slurm.wait_until_drained()
