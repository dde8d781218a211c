"""The search step's driver side: one MLflow parent run, a Tuner over the train loop, one nested
MLflow run per trial, a Prefect table of the trials."""

from __future__ import annotations

import contextvars
import posixpath
import threading
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

import trainlib
from cifar.dataset import Dataset
from cifar.train_loop import TrainConfig
from mlops.lineage import log_dataset_inputs
from mlops.system_metrics import HostMetricsCallback, system_metrics
from mlops.tracking import MLflowCallback, start_run, terminated_run
from tasks.layout import StorageLayout
from tasks.monitoring import pipeline_info_logs
from tasks.search_space import search_space
from tasks.train import CHECKPOINTS, METRIC, TrainedRun, cifar_trainer
from tasks.training_slot import training_slot
from trainlib import DaskConfig, RunConfig, tune
from trainlib.torch import TorchTrainer

EXPERIMENT = "tune-cifar"
STUDY_STORAGE_VARIABLE = "CIFAR_STUDY_STORAGE"  # a work pool's study store (an Optuna URL)
TRIALS_KEY = "tune-trials"
SUMMARY_KEY = "tune-cifar-summary"


@dataclass(frozen=True)
class TuneRequest:
    """Everything one search needs (plain data: it crosses into the Prefect task)."""

    base: TrainConfig
    search_space: dict[str, list[Any]]
    num_samples: int
    max_concurrent_trials: int | None
    dataset: Dataset
    layout: StorageLayout
    name: str
    num_workers: int
    tracking_uri: str
    dask_config: DaskConfig
    study_storage: str | None = None  # an Optuna RDB URL; None: sqlite under the storage path
    data_url: str | None = None  # the archive's URL: the source of the runs' MLflow datasets
    system_metrics: bool = True  # the driver's on the parent run, each trial's hosts on its run


@dataclass(frozen=True)
class TunedSearch:
    """A finished search: its parent MLflow run, the best trial's run, every trial."""

    parent_run_id: str
    best: TrainedRun
    best_config: dict[str, Any]
    trials: list[dict[str, Any]] = field(default_factory=list)


def search_name(name: str | None, flow_run_id: str | None) -> str:
    """``name`` if given; else one per flow run, so a retried task resumes the search."""
    return name or f"tune-cifar-{flow_run_id or uuid.uuid4().hex}"


class TrialTracker(tune.Callback):
    """One nested MLflow run per trial (params, per-epoch metrics, state) and a Prefect table
    of the trials, updated as they start and end."""

    def __init__(
        self,
        tracking_uri: str,
        search: str,
        parent_run_id: str,
        base: TrainConfig,
        on_table: Any = None,
        dataset: Dataset | None = None,
        data_url: str | None = None,
        host_metrics: bool = False,
    ) -> None:
        self._tracking_uri = tracking_uri
        self._host_metrics = host_metrics
        self._dataset, self._data_url = dataset, data_url
        self._base = asdict(base)
        self._search = search
        self._parent = parent_run_id
        self._run_ids: dict[str, str] = {}
        self._client = MlflowClient(tracking_uri)
        self._local = threading.local()  # each trial runs in a thread of its own
        self._rows: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._on_table = on_table

    def hyperparameters(self, trial: tune.Trial) -> dict[str, Any]:
        """The trial's full TrainConfig: the base config with its sampled values."""
        return {**self._base, **trial.config["train_loop_config"]["hyperparameters"]}

    def on_trial_start(self, trial: tune.Trial) -> None:
        params = self.hyperparameters(trial)
        run_id = start_run(
            self._tracking_uri,
            EXPERIMENT,
            f"{self._search}/{trial.name}",  # resumed trials continue their MLflow run
            params=params,
            tags={"mlflow.parentRunId": self._parent, "trial": trial.name},
        )
        self._run_ids[trial.name] = run_id
        if self._dataset is not None:
            log_dataset_inputs(self._tracking_uri, run_id, self._dataset, self._data_url)
        self._local.tracker = MLflowCallback(self._tracking_uri, run_id)
        self._local.hosts = (
            HostMetricsCallback(self._tracking_uri, run_id) if self._host_metrics else None
        )
        self._local.run_id = run_id
        self._table(trial, params, None)

    def on_start(self, run: trainlib.RunInfo) -> None:
        self._local.tracker.on_start(run)

    def on_group_start(self, group: trainlib.GroupInfo) -> None:
        if self._local.hosts is not None:
            self._local.hosts.on_group_start(group)

    def on_group_end(self, group: trainlib.GroupInfo) -> None:
        if self._local.hosts is not None:
            self._local.hosts.on_group_end(group)

    def on_report(self, report: trainlib.Report) -> None:
        self._local.tracker.on_report(report)

    def on_end(self, result: trainlib.Result) -> None:
        """Ctrl-C: the trial's run is KILLED (resuming the search reopens it). Otherwise the
        trial's state decides its status (``on_trial_end``)."""
        if isinstance(result.error, KeyboardInterrupt):
            self._client.set_terminated(self._local.run_id, RunStatus.to_string(RunStatus.KILLED))

    def on_trial_end(self, trial: tune.Trial) -> None:
        status = {"complete": RunStatus.FINISHED, "pruned": RunStatus.KILLED}
        run_id = self._local.run_id
        self._client.set_tag(run_id, "trial_state", trial.state)
        self._client.set_terminated(
            run_id, RunStatus.to_string(status.get(trial.state, RunStatus.FAILED))
        )
        params = self.hyperparameters(trial)
        self._table(trial, params, trial.result.metrics.get(METRIC) if trial.result else None)

    def run_id_of(self, trial_name: str) -> str:
        """The MLflow run of the trial named ``trial_name``."""
        return self._run_ids[trial_name]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The trials table, one row per trial."""
        with self._lock:
            return [dict(self._rows[n]) for n in sorted(self._rows)]

    def _table(self, trial: tune.Trial, params: dict[str, Any], value: Any) -> None:
        with self._lock:
            row = self._rows.setdefault(trial.number, {"trial": trial.number})
            row.update({k: params[k] for k in ("model", "lr", "batch_size")})
            row.update({"state": trial.state, METRIC: value, "mlflow_run_id": self._local.run_id})
            rows = [self._rows[n] for n in sorted(self._rows)]
        if self._on_table is not None:
            self._on_table(rows)


def run_search(request: TuneRequest, on_table: Any = None) -> TunedSearch:
    """Run the search under one MLflow parent run; return the best trial (by val_accuracy)."""
    parent = start_run(
        request.tracking_uri,
        EXPERIMENT,
        request.name,
        params={
            "num_samples": request.num_samples,
            "search_space": str(request.search_space),
            "num_workers": request.num_workers,
        },
        tags={"search": request.name},
    )
    log_dataset_inputs(request.tracking_uri, parent, request.dataset, request.data_url)
    tracker = TrialTracker(
        request.tracking_uri,
        request.name,
        parent,
        request.base,
        on_table,
        dataset=request.dataset,
        data_url=request.data_url,
        host_metrics=request.system_metrics,
    )
    trainer = cifar_trainer(request.base, request.dataset, request.num_workers, request.dask_config)
    space = search_space(request.search_space)
    tuner = _tuner(request, trainer, space, tracker)
    with (
        terminated_run(request.tracking_uri, parent),
        system_metrics(request.tracking_uri, parent, request.system_metrics),
    ):
        grid = tuner.fit()
    best = grid.get_best_result()
    checkpoint, best_metrics = best.best_checkpoints[0]
    trained = TrainedRun(
        run_id=tracker.run_id_of(best.path.rstrip("/").rsplit("/", 1)[-1]),
        best_checkpoint_uri=checkpoint.filesystem.unstrip_protocol(checkpoint.path),
        best_metrics=best_metrics,
        final_metrics=best.metrics,
        run_path=best.filesystem.unstrip_protocol(best.path),
    )
    config = {**asdict(request.base), **best.config["train_loop_config"]["hyperparameters"]}
    return TunedSearch(parent, trained, config, tracker.rows)


def _tuner(
    request: TuneRequest, trainer: TorchTrainer, space: dict[str, Any], tracker: TrialTracker
) -> tune.Tuner:
    """The search named ``request.name``: restored where a try of it stored it (a retried
    task, or the flow run again with the same name), else a new one."""
    param_space = {"train_loop_config": {"hyperparameters": space}}
    run_config = RunConfig(
        name=request.name,
        storage_path=request.layout.runs,
        checkpoint_config=CHECKPOINTS,
        callbacks=[tracker],
    )
    directory = posixpath.join(request.layout.runs, request.name)
    if tune.Tuner.can_restore(directory):  # a retried task, or the same name again: resumed
        return tune.Tuner.restore(
            directory, trainer, param_space=param_space, run_config=run_config
        )
    return tune.Tuner(
        trainer,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode="max",
            num_samples=request.num_samples,
            max_concurrent_trials=request.max_concurrent_trials,
            scheduler=tune.ASHAScheduler(max_t=request.base.epochs, grace_period=1),
            study_storage=request.study_storage,
        ),
        run_config=run_config,
    )


@task(name="tune", cache_policy=NO_CACHE)  # no tags: tasks.training_slot
def tune_task(request: TuneRequest) -> TunedSearch:
    """Run the search, with the trials' table as a Prefect artifact updated as trials end."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    # The tracker calls back from each trial's thread: run the artifact call in this task's
    # context (contextvars do not reach threads), one thread at a time.
    context, lock = contextvars.copy_context(), threading.Lock()

    def show(rows: list[dict[str, Any]]) -> None:
        with lock:
            context.run(
                create_table_artifact,
                key=TRIALS_KEY,
                table=rows,
                description="Trials: params, val_accuracy, state",
            )

    with pipeline_info_logs(), training_slot(request.dask_config, request.name) as fenced:
        searched = run_search(replace(request, dask_config=fenced), on_table=show)
    best = ", ".join(f"{k}={searched.best_config[k]}" for k in ("model", "lr", "batch_size"))
    create_markdown_artifact(
        key=SUMMARY_KEY,
        description="tune-cifar: the best trial",
        markdown="\n".join(
            [
                "# tune-cifar",
                f"- Search `{request.name}`: {len(searched.trials)} trials (table `{TRIALS_KEY}`)",
                f"- Best trial: {best}, {METRIC} **{searched.best.best_metrics[METRIC]:.4f}**",
                f"- Its MLflow run: `{searched.best.run_id}` (under `{searched.parent_run_id}`)",
            ]
        ),
    )
    return searched
