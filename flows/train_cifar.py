"""The train-cifar flow: CIFAR-10 from a URL to a registered, evaluated, promoted model."""

from __future__ import annotations

import posixpath
import uuid
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from tasks.cifar import OFFICIAL_MD5, OFFICIAL_URL
from tasks.cluster import dask_config
from tasks.data import download_task
from tasks.evaluate import evaluate_task
from tasks.models import check_model_name
from tasks.monitoring import summarize_task, tag_flow_run
from tasks.predict import predict_task
from tasks.preprocess import preprocess_task
from tasks.registry import CHAMPION, promote_task, register_task
from tasks.tracking import finish_run, resolve_tracking_uri, use_tracking_uri
from tasks.train import TrainConfig, train_task


@flow(name="train-cifar")
def train_cifar(
    data_url: str = OFFICIAL_URL,
    data_md5: str | None = None,
    storage_path: str = "./cifar-data",
    model: str = "small_cnn",
    epochs: int = 5,
    batch_size: int = 256,
    lr: float = 0.05,
    num_workers: int = 2,
    use_gpu: bool = False,
    dask_address: str | None = None,
    dask_cluster_class: str | None = None,
    dask_cluster_kwargs: dict[str, Any] | None = None,
    mlflow_tracking_uri: str | None = None,
    registered_model_name: str = "cifar10-classifier",
    promote_margin: float = 0.0,
    predict_input: str | None = None,
    shard_size: int = 2500,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Download, preprocess, train, register, evaluate, promote and (optionally) predict.

    ``data_md5`` defaults to the official archive's checksum when ``data_url`` is the official
    URL; for another URL without ``data_md5`` the archive is checked by structure only and
    logged as unverified. Without ``mlflow_tracking_uri``, $MLFLOW_TRACKING_URI or
    ``sqlite:///mlflow.db`` is used. Dask: ``dask_address`` (an existing scheduler), else
    ``dask_cluster_class`` started with ``dask_cluster_kwargs`` (e.g.
    ``"dask_jobqueue.SLURMCluster"``), else $DASK_SCHEDULER_ADDRESS, else a LocalCluster.
    ``run_name`` names the training run (checkpoints and the MLflow run); running a flow again
    with the same ``run_name`` and ``storage_path`` resumes it. Default: one per flow run.
    Returns the MLflow run id, model version, test accuracy and whether the version was
    promoted to ``@champion``.
    """
    check_model_name(model)
    tag_flow_run(
        [f"model:{model}", f"world_size:{num_workers}", f"device:{'cuda' if use_gpu else 'cpu'}"]
    )
    mlflow_tracking_uri = resolve_tracking_uri(mlflow_tracking_uri)
    dask = dask_config(dask_address, dask_cluster_class, dask_cluster_kwargs)
    use_tracking_uri(mlflow_tracking_uri)
    md5 = data_md5 or (OFFICIAL_MD5 if data_url == OFFICIAL_URL else None)
    archive = download_task(data_url, storage_path, md5)
    dataset = preprocess_task(
        archive.uri,
        archive.md5,
        archive.verified,
        storage_path,
        shard_size=shard_size,
        dask=dask,
        num_workers=num_workers,
    )
    config = TrainConfig(
        dataset_uri=dataset,
        model=model,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        use_gpu=use_gpu,
    )
    trained = train_task(
        config,
        run_name=run_name or f"train-cifar-{flow_run.get_id() or uuid.uuid4().hex}",
        num_workers=num_workers,
        storage_path=storage_path,
        tracking_uri=mlflow_tracking_uri,
        dask=dask,
    )
    version = register_task(trained, dataset, registered_model_name)
    evaluation = evaluate_task(registered_model_name, version, dataset, trained.run_id)
    promotion = promote_task(registered_model_name, version, evaluation.accuracy, promote_margin)
    finish_run(mlflow_tracking_uri, trained.run_id)
    summary: dict[str, Any] = {
        "mlflow_run_id": trained.run_id,
        "model_name": registered_model_name,
        "model_version": version,
        "test_accuracy": evaluation.accuracy,
        "promoted": promotion.promoted,
        "alias": promotion.alias,
        "data_verified": archive.verified,
    }
    summarize_task(summary, mlflow_tracking_uri, promotion.reason)
    if predict_input:
        output = posixpath.join(storage_path, "predictions", f"{trained.run_id}.csv")
        summary["predictions"] = predict_task(
            registered_model_name, CHAMPION, predict_input, output
        ).output_uri
    return summary
