"""The training step's driver side: one MLflow run, one TorchTrainer run over the dataset."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State

import trainlib
from cifar.dataset import Dataset, ingest_config, split_arrays
from cifar.models import ModelSpec
from cifar.train_loop import TrainConfig, cifar_train_func, loop_config
from mlops.lineage import log_dataset_inputs
from mlops.system_metrics import HostMetricsCallback, system_metrics
from mlops.tracking import MLflowCallback, start_run
from tasks.layout import StorageLayout
from tasks.monitoring import PrefectProgressCallback, pipeline_info_logs
from tasks.training_slot import training_slot
from trainlib import CheckpointConfig, DaskConfig, RunConfig, ScalingConfig, WorkerGroupError
from trainlib.torch import TorchTrainer

EXPERIMENT = "train-cifar"
RUN_PREFIX = "train-cifar-"  # + the flow run's id: a run's default name
METRIC = "val_accuracy"  # what the best checkpoint is chosen by (cifar_train_func reports it)
# The best checkpoint and the latest (the one a resumed run continues from), in train and tune.
CHECKPOINTS = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute=METRIC)


@dataclass(frozen=True)
class TrainRequest:
    """Everything one training step needs (plain data: it crosses into the Prefect task)."""

    config: TrainConfig
    dataset: Dataset
    layout: StorageLayout
    run_name: str
    num_workers: int
    tracking_uri: str
    dask_config: DaskConfig
    data_url: str | None = None  # the archive's URL: the source of the run's MLflow datasets
    system_metrics: bool = True  # system metrics of the driver and the ranks' hosts on the run


@dataclass(frozen=True)
class TrainedRun:
    """A finished training run (what train and tune return to their flows): its MLflow run, its
    best checkpoint (by val_accuracy)."""

    run_id: str
    best_checkpoint_uri: str
    best_metrics: dict[str, Any]
    final_metrics: dict[str, Any]
    run_path: str


def training_run_name(run_name: str | None, flow_run_id: str | None) -> str:
    """``run_name`` if given; else one per flow run, so a retried train task resumes it."""
    return run_name or f"{RUN_PREFIX}{flow_run_id or uuid.uuid4().hex}"


def run_tags(config: TrainConfig, num_workers: int) -> dict[str, str]:
    """Model, world size and device: the tags of the MLflow run and of the flow run."""
    return {
        "model": config.model,
        "world_size": str(num_workers),
        "device": "cuda" if config.use_gpu else "cpu",
    }


def training_params(config: TrainConfig, num_workers: int) -> dict[str, Any]:
    """The training configuration as the MLflow run's params (what makes one run another)."""
    return {**asdict(config), "num_workers": num_workers}


def cifar_trainer(
    config: TrainConfig,
    dataset: Dataset,
    num_workers: int,
    dask_config: DaskConfig,
    run_config: RunConfig | None = None,
) -> TorchTrainer:
    """The TorchTrainer of ``cifar_train_func`` on ``num_workers`` ranks over the dataset's
    train and val splits: what a training step runs, and each trial of a search."""
    manifest = dataset.manifest
    spec = ModelSpec(config.model, manifest.mean, manifest.std)
    return TorchTrainer(
        cifar_train_func,
        train_loop_config=loop_config(config, spec, manifest.rows("train")),
        datasets={"train": split_arrays(dataset, "train"), "val": split_arrays(dataset, "val")},
        dataset_config=ingest_config(config.use_gpu),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=config.use_gpu),
        run_config=run_config,
        dask_config=dask_config,
    )


def train(request: TrainRequest, callbacks: Sequence[trainlib.Callback] = ()) -> TrainedRun:
    """Train with one MLflow run (created here, on the driver) receiving every report.

    Running the same ``run_name`` again (the driver died; a task retry) resumes from its latest
    checkpoint and continues the same MLflow run.
    """
    config = request.config
    run_id = start_run(
        request.tracking_uri,
        EXPERIMENT,
        request.run_name,
        params=training_params(config, request.num_workers),
        tags=run_tags(config, request.num_workers),
    )
    log_dataset_inputs(request.tracking_uri, run_id, request.dataset, request.data_url)
    trackers: list[trainlib.Callback] = [MLflowCallback(request.tracking_uri, run_id)]
    if request.system_metrics:
        trackers.append(HostMetricsCallback(request.tracking_uri, run_id))
    trainer = cifar_trainer(
        config,
        request.dataset,
        request.num_workers,
        request.dask_config,
        RunConfig(
            name=request.run_name,
            storage_path=request.layout.runs,
            checkpoint_config=CHECKPOINTS,
            callbacks=[*trackers, *callbacks],
        ),
    )
    with system_metrics(request.tracking_uri, run_id, request.system_metrics):
        result = trainer.fit()
    best, best_metrics = result.best_checkpoints[0]
    return TrainedRun(
        run_id=run_id,
        best_checkpoint_uri=best.filesystem.unstrip_protocol(best.path),
        best_metrics=best_metrics,
        final_metrics=result.metrics,
        run_path=result.filesystem.unstrip_protocol(result.path),
    )


def is_infrastructure_failure(task: object, task_run: object, state: State) -> bool:
    """Retry the train task when a worker or rank process was lost, not when the training
    code raised (a diverged loss, a bug): running it again would fail the same way."""
    try:
        state.result()
    except WorkerGroupError as error:
        return error.root_cause.kind in ("worker_lost", "preempted", "exit", "hang", "fenced")
    except Exception:
        return False
    return False


@task(
    name="train",
    cache_policy=NO_CACHE,  # no tags: the training slot is the cluster's (tasks.training_slot)
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=is_infrastructure_failure,
)
def train_task(request: TrainRequest) -> TrainedRun:
    """Train, with progress and per-epoch metrics shown as Prefect artifacts and logs, holding
    one of the cluster's training slots."""
    with pipeline_info_logs(), training_slot(request.dask_config, request.run_name) as fenced:
        request = replace(request, dask_config=fenced)
        return train(request, callbacks=[PrefectProgressCallback(request.config.epochs)])
