"""The tune-cifar flow: CIFAR-10 from a URL, a hyperparameter search, the best trial registered,
evaluated and promoted."""

from __future__ import annotations

import os
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
from mlops.release_gates import DEFAULT_MAX_CLASS_DROP, DEFAULT_MIN_TEST_ACCURACY
from tasks.monitoring import tag_flow_run
from tasks.search_space import DEFAULT_SEARCH_SPACE, check_search_space, largest_batch_size
from tasks.tune import EXPERIMENT, STUDY_STORAGE_VARIABLE, TuneRequest, search_name, tune_task


@flow(name="tune-cifar", persist_result=True)  # see flows/__init__.py
def tune_cifar(
    data_url: str = OFFICIAL_URL,
    data_md5: str | None = None,
    storage_path: str | None = None,
    search_space: dict[str, list[Any]] | None = None,
    num_samples: int = 8,
    max_concurrent_trials: int = 2,
    epochs: int = 5,
    seed: int = 0,
    num_workers: int = 1,
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
    rows_per_file: int = 2500,
    run_name: str | None = None,
    study_storage: str | None = None,
    system_metrics: bool = True,
    timeout_minutes: float | None = 2880.0,
) -> dict[str, Any]:
    """Download, preprocess, search, register the best trial, evaluate and promote it.

    ``search_space`` maps TrainConfig fields to ``[kind, args...]`` with kind one of uniform,
    loguniform, quniform, randint, choice, grid_search (default: lr and batch size, with the
    model fixed to small_cnn). ``num_samples`` trials of ``num_workers`` ranks each run
    ``max_concurrent_trials`` at a time on one cluster; ASHA stops the unpromising ones early.
    ``seed`` (each trial's), ``use_gpu``, ``compile`` and the Dask options are train-cifar's.
    ``run_name`` names the search (the same name and storage path resume it). The Optuna study
    is a sqlite file under the storage path, or ``study_storage`` (default:
    $CIFAR_STUDY_STORAGE; an Optuna storage URL such as ``postgresql://...`` or
    ``sqlite:////studies/optuna.db``; needed with ``s3://`` storage). ``storage_path``
    defaults to $CIFAR_STORAGE_PATH, else ``./cifar-data``. The best trial's model goes through
    train-cifar's rule: registered, evaluated on the test split, promoted to ``@champion`` if it
    beats it. ``registered_model_name``, ``promote_margin``, ``promote_alpha``,
    ``min_test_accuracy``, ``max_class_drop``, ``check_fresh_load``, ``system_metrics`` and
    ``timeout_minutes`` are train-cifar's.
    """
    with time_limit(timeout_minutes, "tune-cifar"):
        policy = run_policy()  # the worker's: what places and servers a run may name
        policy.confine(
            data_url=data_url,
            storage_path=storage_path,
            mlflow_tracking_uri=mlflow_tracking_uri,
            study_storage=study_storage,
        )
        space = search_space or DEFAULT_SEARCH_SPACE
        check_search_space(space)  # a mistake fails before anything is downloaded
        base = TrainConfig(epochs=epochs, seed=seed, use_gpu=use_gpu, compile=compile)
        tag_flow_run({"search": "tune-cifar", "trials": str(num_samples)})
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
            cluster_workers=num_workers * max_concurrent_trials,
            ranks=num_workers,
            batch_size=largest_batch_size(space, base),
            rows_per_file=rows_per_file,
        ) as ready:
            request = TuneRequest(
                base=base,
                search_space=space,
                num_samples=num_samples,
                max_concurrent_trials=max_concurrent_trials,
                dataset=ready.dataset,
                layout=ready.layout,
                name=search_name(run_name, flow_run.get_id()),
                num_workers=num_workers,
                tracking_uri=ready.tracking_uri,
                dask_config=ready.dask_config,
                study_storage=study_storage or os.environ.get(STUDY_STORAGE_VARIABLE),
                data_url=data_url,
                system_metrics=system_metrics,
            )
            searched = tune_task(request)
        extra = {"search_run_id": searched.parent_run_id, "best_config": searched.best_config}
        return publish(
            searched.best,
            ready.archive,
            ready.dataset,
            registered_model_name,
            PromotionRule(
                promote_margin, promote_alpha, min_test_accuracy, max_class_drop, check_fresh_load
            ),
            ready.tracking_uri,
            extra,
        )
