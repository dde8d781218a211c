"""The tune-cifar flow: CIFAR-10 from a URL, a hyperparameter search, the best trial registered,
evaluated and promoted."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from cifar.format import OFFICIAL_URL
from cifar.train_loop import TrainConfig
from flows.clusters import allowed_dask_config
from flows.prepare import prepared
from flows.publish import publish
from flows.run_ownership import claim_run_name, fingerprint
from flows.run_policy import run_policy
from flows.time_limit import time_limit
from mlops.promotion import PromotionRule
from mlops.registry import model_name_for
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
    promote_alpha: float | None = None,
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

    The best trial's model goes through train-cifar's rule: registered, evaluated on the test
    images, promoted to ``@champion`` if it beats it (the parameters shared with train-cifar
    mean what they mean there).

    Args:
        data_url: The CIFAR-10 python archive, any fsspec URL.
        data_md5: The archive's MD5 (default: the official one for the official URL).
        storage_path: Datasets, checkpoints and cache records; default $CIFAR_STORAGE_PATH.
        search_space: TrainConfig fields mapped to ``[kind, args...]``, kind one of uniform,
            loguniform, quniform, randint, choice, grid_search; default: lr and batch size,
            the model fixed to small_cnn.
        num_samples: How many trials.
        max_concurrent_trials: Trials at once on the cluster; ASHA stops unpromising ones.
        epochs: Each trial's most epochs.
        seed: Each trial's seed.
        num_workers: Ranks per trial.
        use_gpu: One GPU per rank.
        compile: Wrap each trial's model in ``torch.compile``.
        dask_address: An existing scheduler (as train-cifar's).
        dask_cluster_class: A cluster class to start (as train-cifar's).
        dask_cluster_kwargs: Its keyword arguments.
        dask_worker_timeout_s: How long to wait for a trial's workers.
        mlflow_tracking_uri: MLflow's server or store; default $MLFLOW_TRACKING_URI.
        registered_model_name: Where the best trial's model is registered.
        promote_margin: The accuracy gain over ``@champion`` the best trial must show.
        promote_alpha: The registered model's lifetime false-promotion budget, taken at its
            first version only (default 0.05: ``mlops.ledger``).
        min_test_accuracy: Release gate: the least test accuracy.
        max_class_drop: Release gate: each class shown at most this below the champion.
        check_fresh_load: Release gate: the registered model loaded anew scores the same.
        rows_per_file: Images per dataset file.
        run_name: Names the search; the same name and storage path resume it.
        study_storage: The Optuna study, an Optuna storage URL (``postgresql://...``,
            ``sqlite:////studies/optuna.db``); default $CIFAR_STUDY_STORAGE, else a sqlite
            file under the storage path (needed with ``s3://`` storage).
        system_metrics: Log CPU, memory (and GPU) use of the hosts every 10 s.
        timeout_minutes: A longer search fails, its trials stopped (None: no limit).
    """
    with time_limit(timeout_minutes, "tune-cifar"):
        policy = run_policy()  # the worker's: what places and servers a run may name
        policy.confine(
            data_url=data_url,
            storage_path=storage_path,
            mlflow_tracking_uri=mlflow_tracking_uri,
            study_storage=study_storage,
            registered_model_name=registered_model_name,
        )
        space = search_space or DEFAULT_SEARCH_SPACE
        check_search_space(space)  # a mistake fails before anything is downloaded
        base = TrainConfig(epochs=epochs, seed=seed, use_gpu=use_gpu, compile=compile)
        rule = PromotionRule(
            promote_margin, promote_alpha, min_test_accuracy, max_class_drop, check_fresh_load
        )
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
            policy=policy,
        ) as ready:
            name_of_search = search_name(run_name, flow_run.get_id())
            searched_for = {"space": space, "base": asdict(base), "trials": num_samples}
            digest = ready.dataset.manifest.digest()
            claim_run_name(ready.layout, name_of_search, fingerprint(digest, searched_for), policy)
            request = TuneRequest(
                base=base,
                search_space=space,
                num_samples=num_samples,
                max_concurrent_trials=max_concurrent_trials,
                dataset=ready.dataset,
                layout=ready.layout,
                name=name_of_search,
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
            model_name_for(registered_model_name, ready.dataset.manifest.synthetic),
            rule,
            ready.tracking_uri,
            extra,
        )
