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
from flows.redirects import final_url
from flows.run_ownership import claim_run_name, fingerprint
from flows.run_policy import run_policy
from flows.time_limit import time_limit
from mlops.promotion import PromotionRule
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
    promote_alpha: float | None = None,
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

    Where a worker has a run policy, every place, server and cluster class a run names must be
    one it allows (``flows.run_policy``), else the run fails before anything is read.

    Args:
        data_url: The CIFAR-10 python archive, any fsspec URL.
        data_md5: The archive's MD5; default the official one for the official URL, else
            checked by structure only and logged as unverified.
        storage_path: Where datasets, checkpoints and Prefect's cache records go (any fsspec
            URL); default $CIFAR_STORAGE_PATH, else ``./cifar-data``.
        model: The network: ``small_cnn`` or ``resnet18``.
        epochs: Passes over the training images.
        batch_size: Images per step on each rank.
        lr: The learning rate.
        seed: Seeds the initial weights and the order of the training images (not the
            train/validation split of the archive).
        num_workers: Ranks (DDP processes), one per Dask worker.
        use_gpu: One GPU per rank.
        compile: Wrap the model in ``torch.compile`` on every rank.
        dask_address: An existing scheduler; else ``dask_cluster_class``, else
            $DASK_SCHEDULER_ADDRESS, else a LocalCluster.
        dask_cluster_class: A cluster class to start, e.g. ``dask_jobqueue.SLURMCluster``.
        dask_cluster_kwargs: Its keyword arguments.
        dask_worker_timeout_s: How long to wait for ``num_workers`` workers.
        mlflow_tracking_uri: MLflow's server or store; default $MLFLOW_TRACKING_URI, else
            ``./mlflow.db``.
        registered_model_name: Default ``cifar10-classifier`` (``-synthetic`` for a
            synthetic archive).
        promote_margin: The accuracy gain over ``@champion`` the new version must show.
        promote_alpha: The registered model's lifetime false-promotion budget, taken at its
            first version only (default 0.05; later runs spend from it: ``mlops.ledger``).
        min_test_accuracy: Release gate: the least test accuracy.
        max_class_drop: Release gate: each class's accuracy must be shown to be at most this
            below the champion's (1 turns the gate off).
        check_fresh_load: Release gate: the registered model, loaded in a new process,
            scores like the evaluation.
        predict_input: Images to predict with the new champion (any fsspec URL).
        rows_per_file: Images per dataset file (a partition when training).
        run_name: Names the training run (checkpoints, MLflow); the same name and storage
            path resume it. Default: one per flow run.
        system_metrics: Log CPU, memory (and GPU) use of the driver and the ranks' hosts
            every 10 s.
        force: Train even when nothing would change (the champion's data, commit and
            configuration: ``tasks.retraining``).
        timeout_minutes: A longer run fails, its training stopped (None: no limit).

    Returns:
        The MLflow run id, model version, test accuracy and whether the version became
        ``@champion`` (else ``@challenger``: the gain's one-sided lower confidence limit on
        the same test images did not clear ``promote_margin``, or a release gate failed).
    """
    with time_limit(timeout_minutes, "train-cifar"):
        policy = run_policy()  # the worker's: what places and servers a run may name
        policy.confine(
            data_url=data_url,
            storage_path=storage_path,
            mlflow_tracking_uri=mlflow_tracking_uri,
            predict_input=predict_input,
            registered_model_name=registered_model_name,
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
        rule = PromotionRule(
            promote_margin, promote_alpha, min_test_accuracy, max_class_drop, check_fresh_load
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
            policy=policy,
        ) as ready:
            name = model_name_for(registered_model_name, ready.dataset.manifest.synthetic)
            params = training_params(config, num_workers)
            digest = ready.dataset.manifest.digest()
            if not force and (reason := unchanged_task(name, digest, params, ready.tracking_uri)):
                return {"skipped": True, "reason": reason, "model_name": name}
            name_of_run = training_run_name(run_name, flow_run.get_id())
            claim_run_name(ready.layout, name_of_run, fingerprint(digest, params), policy)
            request = TrainRequest(
                config=config,
                dataset=ready.dataset,
                layout=ready.layout,
                run_name=name_of_run,
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
            name,
            rule,
            ready.tracking_uri,
        )
        # housekeeping: a failure is logged on its task, never the night's
        tidy_storage_task(
            ready.layout.runs, trained.run_path, trained.best_checkpoint_uri, return_state=True
        )
        if predict_input:
            output = ready.layout.predictions(trained.run_id)
            name = summary["model_name"]
            source = final_url("predict_input", predict_input, policy)
            predictions = predict_task(name, CHAMPION, source, output, ready.tracking_uri)
            summary["predictions"] = predictions.output_uri
        return summary
