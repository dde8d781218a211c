"""The train-cifar/manual deployment, run by a real Prefect process worker, on a real SLURM
cluster (tests/slurm_rig.py) through dask-jobqueue."""

from __future__ import annotations

import re
from pathlib import Path

from prefect.client.schemas.objects import Log
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from cifar.format import write_synthetic_archive
from tests.prefect_records import flow_run_logs
from tests.prefect_stack import deploy_all
from tests.slurm_rig import SlurmCluster

RUN_TIMEOUT_S = 300
PLACED = re.compile(r"rank (\d) on \S+ \(pid \d+, SLURM job (\d+)\)")


def _placed(logs: list[Log]) -> dict[str, str]:
    """Rank → SLURM job id, from the ranks' "rank N on HOST (pid P, SLURM job J)" lines."""
    return dict(m.groups() for m in map(PLACED.search, (log.message for log in logs)) if m)


def test_deployment_run_by_a_worker_trains_in_slurm_jobs(
    slurm: SlurmCluster, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    deploy_all(prefect_env)
    archive = tmp_path / "cifar-10-python.tar.gz"
    md5 = write_synthetic_archive(str(archive), images_per_batch=200)
    cluster_kwargs = {
        "cores": 1,
        "processes": 1,
        "memory": "1GB",
        "walltime": "00:10:00",
        "interface": "lo",
        "local_directory": str(tmp_path / "dask"),
        "log_directory": str(tmp_path / "jobs"),
    }
    with temporary_settings({PREFECT_API_URL: prefect_env["PREFECT_API_URL"]}):
        run = run_deployment(
            name="train-cifar/manual",
            parameters={
                "data_url": archive.as_uri(),
                "data_md5": md5,
                "epochs": 1,
                "batch_size": 64,
                "rows_per_file": 250,
                "storage_path": str(tmp_path / "store"),
                "mlflow_tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "registered_model_name": "slurm-deployed",
                "dask_cluster_class": "dask_jobqueue.SLURMCluster",
                "dask_cluster_kwargs": cluster_kwargs,
            },
            # How a site points the pool's flow runs at its SLURM cluster (a run's env
            # replaces the deployment's: keep its logging setting).
            job_variables={
                "env": {**slurm.env, "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib,cifar,tasks"}
            },
            timeout=RUN_TIMEOUT_S,
            poll_interval=1,
        )
        assert run.state.is_completed(), run.state
        logs = flow_run_logs(run.id, until=lambda logs: len(_placed(logs)) == 2)
    messages = [log.message for log in logs]
    placed = _placed(logs)
    assert sorted(placed) == ["0", "1"], messages[-20:]
    assert {f.name.rsplit("-", 1)[-1] for f in (tmp_path / "jobs").glob("*.err")} >= {
        f"{job}.err" for job in placed.values()
    }
    slurm.wait_until_drained()
