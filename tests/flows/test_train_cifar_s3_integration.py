"""train-cifar with data and storage on S3 and an MLflow server keeping artifacts on S3.

S3 is moto's server over HTTP; credentials and endpoint come only from the standard AWS_*
environment variables, as in production. The secret must not show up anywhere a user can read.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import s3fs
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client

from cifar.format import write_synthetic_archive
from flows.train_cifar import train_cifar
from tests.conftest import S3_BUCKET
from tests.mlflow_rig import mlflow_server as mlflow_server_at
from tests.prefect_records import flow_finished, flow_run_logs

SECRET = "s3cr3t-never-log-7f3a9c"
MLFLOW_BUCKET = "mlflow-artifacts"


@pytest.fixture(scope="module")
def s3_env(s3_filesystem: s3fs.S3FileSystem) -> Iterator[dict[str, str]]:
    endpoint = s3_filesystem.client_kwargs["endpoint_url"]
    env = {
        "AWS_ACCESS_KEY_ID": "pipeline-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3_filesystem.mkdir(MLFLOW_BUCKET)
    # fsspec reuses a filesystem made with the same arguments: one an earlier test made in this
    # process carries the credentials and endpoint the environment had then
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        yield env
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def mlflow_server(
    s3_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server_at(
        root,
        *("--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts"),
        env={"MLFLOW_S3_ENDPOINT_URL": s3_env["AWS_ENDPOINT_URL_S3"]},
    ) as url:
        yield url


@pytest.fixture(scope="module")
def s3_run(
    prefect_server: None,
    mlflow_server: str,
    s3_filesystem: s3fs.S3FileSystem,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    local = tmp_path_factory.mktemp("s3src") / "cifar-10-python.tar.gz"
    md5 = write_synthetic_archive(str(local), images_per_batch=200)
    s3_filesystem.put_file(str(local), f"{S3_BUCKET}/source/cifar-10-python.tar.gz")
    state = train_cifar(
        data_url=f"s3://{S3_BUCKET}/source/cifar-10-python.tar.gz",
        data_md5=md5,
        storage_path=f"s3://{S3_BUCKET}/store",
        epochs=2,
        batch_size=64,
        rows_per_file=250,
        mlflow_tracking_uri=mlflow_server,
        registered_model_name="s3-classifier",
        # a cluster class, as with dask_jobqueue.SLURMCluster (started and closed by the flow)
        dask_cluster_class="distributed.LocalCluster",
        dask_cluster_kwargs={"n_workers": 2, "threads_per_worker": 1, "processes": False},
        return_state=True,
    )
    return {**state.result(), "flow_run_id": state.state_details.flow_run_id}


def test_s3_flow_keeps_data_checkpoints_and_artifacts_on_s3(
    s3_run: dict[str, Any], s3_filesystem: s3fs.S3FileSystem
) -> None:
    s3_filesystem.invalidate_cache()
    store = f"{S3_BUCKET}/store"
    assert s3_filesystem.exists(f"{store}/raw/cifar-10-python.tar.gz")
    datasets = s3_filesystem.ls(f"{store}/datasets")
    assert len(datasets) == 1 and s3_filesystem.exists(f"{datasets[0]}/manifest.json")
    checkpoints = s3_filesystem.glob(f"{store}/runs/*/checkpoint_*/.trainlib-commit.json")
    assert len(checkpoints) == 1  # a published run keeps only its registered checkpoint
    model_files = s3_filesystem.glob(f"{MLFLOW_BUCKET}/artifacts/**/MLmodel")
    assert model_files, "the registered model's files are not on S3"
    assert s3_run["model_version"] == "1" and s3_run["test_accuracy"] > 0.5


def test_s3_flow_never_shows_the_secret(s3_run: dict[str, Any], mlflow_server: str) -> None:
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET  # it was there to leak

    async def parameters() -> str:
        async with get_client() as client:
            return str((await client.read_flow_run(s3_run["flow_run_id"])).parameters)

    logs = flow_run_logs(s3_run["flow_run_id"], until=flow_finished)  # every line, recorded
    texts = [asyncio.run(parameters()), *(log.message for log in logs)]
    run = MlflowClient(mlflow_server).get_run(s3_run["mlflow_run_id"])
    texts += [str(run.data.params), str(run.data.tags)]
    assert len(texts) > 5
    assert not [t for t in texts if SECRET in t]


def test_s3_flow_model_loads_from_the_server(
    s3_run: dict[str, Any], mlflow_server: str, tmp_path: Path
) -> None:
    code = (
        "import mlflow.pyfunc, numpy as np\n"
        "m = mlflow.pyfunc.load_model('models:/s3-classifier@champion')\n"
        "print(np.asarray(m.predict(np.zeros((2, 3, 32, 32), np.uint8))).shape)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**clean, "MLFLOW_TRACKING_URI": mlflow_server},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "(2, 10)"
