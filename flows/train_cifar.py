"""The train-cifar flow: CIFAR-10 from a URL to a registered, evaluated, promoted model."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from cifar.format import OFFICIAL_URL
from cifar.train_loop import TrainConfig
from flows.clusters import allowed_dask_config
from flows.prepare import prepared
from flows.publish import publish
from flows.run_policy import run_policy
from flows.time_limit import time_limit
from mlops.promotion import DEFAULT_ALPHA, PromotionRule
from mlops.registry import model_name_for
from mlops.release_gates import DEFAULT_MAX_CLASS_DROP, DEFAULT_MIN_TEST_ACCURACY
from mlops.version_tags import CHAMPION
from tasks.monitoring import tag_flow_run
from tasks.predict import predict_task
from tasks.retention import tidy_storage_task
from tasks.retraining import unchanged_task
from tasks.train import (
    EXPERIMENT,
    TrainRequest,
    run_tags,
    train_task,
    training_params,
    training_run_name,
)


@flow(name="train-cifar", persist_result=True)  # see flows/__init__.py
def train_cifar(
    data_url: str = OFFICIAL_URL,
    data_md5: str | None = None,
    storage_path: str | None = None,
    model: str = "small_cnn",
    epochs: int = 5,
    batch_size: int = 256,
    lr: float = 0.05,
    seed: int = 0,
    num_workers: int = 2,
    use_gpu: bool = False,
    compile: bool = False,
    dask_address: str | None = None,
    dask_cluster_class: str | None = None,
    dask_cluster_kwargs: dict[str, Any] | None = None,
    dask_worker_timeout_s: float = 60.0,
    mlflow_tracking_uri: str | None = None,
    registered_model_name: str | None = None,
    promote_margin: float = 0.0,
    promote_alpha: float = DEFAULT_ALPHA,
    min_test_accuracy: float = DEFAULT_MIN_TEST_ACCURACY,
    max_class_drop: float = DEFAULT_MAX_CLASS_DROP,
    check_fresh_load: bool = True,
    predict_input: str | None = None,
    rows_per_file: int = 2500,
    run_name: str | None = None,
    system_metrics: bool = True,
    force: bool = False,
    timeout_minutes: float | None = 1440.0,
) -> dict[str, Any]:
    """Download, preprocess, train, register, evaluate, promote and (optionally) predict.

    ``data_md5`` defaults to the official archive's checksum when ``data_url`` is the official
    URL; for another URL without ``data_md5`` the archive is checked by structure only and
    logged as unverified. Without ``mlflow_tracking_uri``, $MLFLOW_TRACKING_URI or
    ``./mlflow.db`` is used; without ``storage_path``, $CIFAR_STORAGE_PATH or ``./cifar-data``
    (a work pool's environment can name all three: docs/containers.md). Dask:
    ``dask_address`` (an existing scheduler), else
    ``dask_cluster_class`` started with ``dask_cluster_kwargs`` (e.g.
    ``"dask_jobqueue.SLURMCluster"``), else $DASK_SCHEDULER_ADDRESS, else a LocalCluster.
    Where a worker has a run policy, the places, servers and cluster classes a run names must be
    ones it allows (``flows.run_policy``), else the run fails before anything is read.
    ``compile`` wraps the model in ``torch.compile`` on every rank. ``seed`` seeds the model's
    initial weights and the order of the training images (recorded with the run's params); the
    split of the archive into train and validation images does not depend on it.
    ``rows_per_file`` is the number of images per dataset file (a partition when training).
    ``run_name`` names the training run (checkpoints and the MLflow run); running the flow again
    with the same ``run_name`` and ``storage_path`` resumes it. Default: one per flow run.
    ``registered_model_name`` defaults to ``cifar10-classifier``, or
    ``cifar10-classifier-synthetic`` when the archive is synthetic (``--synthetic``).
    ``system_metrics`` logs CPU, memory (and GPU) use of the driver and of the ranks' hosts on
    the MLflow run every 10 s.
    Download and preprocess are cached by Prefect under ``storage_path``: a run on the same
    data reuses them (shown as Cached) after checking the files are intact. A run that would
    change nothing (the champion's data, commit and training configuration) ends there,
    saying why, unless ``force`` (``tasks.retraining``).
    ``timeout_minutes``: a run that takes longer fails, its training stopped
    (``flows.time_limit``; None: no limit).
    The new version is promoted to ``@champion`` only if the one-sided lower confidence limit of
    its accuracy gain over the champion, on the same test images, clears ``promote_margin``, at
    the share of ``promote_alpha`` (the lifetime false-promotion budget) this comparison may
    spend (``mlops.promotion``), and only if it passes the release
    gates: test accuracy at least ``min_test_accuracy``, no class's accuracy lower than the
    champion's by more than ``max_class_drop``, and, with ``check_fresh_load``, the registered
    model loaded in a new process scores like the evaluation (``mlops.release_gates``); else
    @challenger.
    Returns the MLflow run id, model version, test accuracy and whether the version was
    promoted to ``@champion``.
    """
    with time_limit(timeout_minutes, "train-cifar"):
        policy = run_policy()  # the worker's: what places and servers a run may name
        policy.confine(
            data_url=data_url,
            storage_path=storage_path,
            mlflow_tracking_uri=mlflow_tracking_uri,
            predict_input=predict_input,
        )
        config = TrainConfig(
            model=model,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            use_gpu=use_gpu,
            compile=compile,
        )
        tag_flow_run(run_tags(config, num_workers))
        dask_config = allowed_dask_config(
            dask_address, dask_cluster_class, dask_cluster_kwargs, dask_worker_timeout_s, policy
        )
        with prepared(
            data_url,
            data_md5,
            storage_path,
            mlflow_tracking_uri,
            EXPERIMENT,
            dask_config,
            cluster_workers=num_workers,
            ranks=num_workers,
            batch_size=batch_size,
            rows_per_file=rows_per_file,
        ) as ready:
            name = model_name_for(registered_model_name, ready.dataset.manifest.synthetic)
            params = training_params(config, num_workers)
            digest = ready.dataset.manifest.digest()
            if not force and (reason := unchanged_task(name, digest, params, ready.tracking_uri)):
                return {"skipped": True, "reason": reason, "model_name": name}
            request = TrainRequest(
                config=config,
                dataset=ready.dataset,
                layout=ready.layout,
                run_name=training_run_name(run_name, flow_run.get_id()),
                num_workers=num_workers,
                tracking_uri=ready.tracking_uri,
                dask_config=ready.dask_config,
                data_url=data_url,
                system_metrics=system_metrics,
            )
            trained = train_task(request)
        summary = publish(
            trained,
            ready.archive,
            ready.dataset,
            registered_model_name,
            PromotionRule(
                promote_margin, promote_alpha, min_test_accuracy, max_class_drop, check_fresh_load
            ),
            ready.tracking_uri,
        )
        # housekeeping: a failure is logged on its task, never the night's
        tidy_storage_task(
            ready.layout.runs, trained.run_path, trained.best_checkpoint_uri, return_state=True
        )
        if predict_input:
            output = ready.layout.predictions(trained.run_id)
            name = summary["model_name"]
            predictions = predict_task(name, CHAMPION, predict_input, output, ready.tracking_uri)
            summary["predictions"] = predictions.output_uri
        return summary
