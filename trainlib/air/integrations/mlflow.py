"""MLflow for searches and training functions, as Ray's ``ray.air.integrations.mlflow``.

- ``MLflowLoggerCallback``: one MLflow run per trial of a search (``RunConfig(callbacks=[...])``
  of a ``Tuner``; of a ``TorchTrainer``, one for its run), its config as parameters, every
  report's numeric metrics at step ``training_iteration`` (or ``timesteps_total``), ended
  FINISHED or FAILED with the trial. A
  ``TrackingCallback``: MLflow out of reach never stops or holds a trial; its records wait and
  are delivered in order once it answers.
- ``setup_mlflow``: inside a training function, sets MLflow up for this trial (tracking URI,
  experiment, an active run with the config as parameters) and returns the ``mlflow`` module,
  or on ranks other than 0 (``rank_zero_only``) a module whose calls do nothing.

The tracking URI and credentials are MLflow's own (``tracking_uri=``, else
``MLFLOW_TRACKING_URI``; ``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` or ``tracking_token``), so
both log into the MLflow the pipeline uses.
"""

from __future__ import annotations

import contextvars
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from trainlib.air.integrations._mlflow_store import experiment_id_of, is_transient, numeric
from trainlib.callbacks import Report, RunInfo, TrackingCallback
from trainlib.result import Result
from trainlib.tune import callback as search
from trainlib.tune.logger import flatten

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

TRIAL_PATH_TAG = "trainlib.trial_path"  # the trial's run directory: a restored trial goes on


@dataclass
class _TrialRun:
    """One trial's MLflow run, as this search's callback knows it."""

    name: str
    config: dict[str, Any]
    run_id: str | None = None
    plain: bool = False  # a run that is no trial of a search: it ends with its run
    stamps: dict[int, int] = field(default_factory=dict)  # report index -> its timestamp (ms)


_TRIAL: contextvars.ContextVar[_TrialRun | None] = contextvars.ContextVar(
    "trainlib_mlflow_trial", default=None
)


class MLflowLoggerCallback(TrackingCallback, search.Callback):
    """Log each trial of a search as an MLflow run (Ray's ``MLflowLoggerCallback``).

    Args:
        tracking_uri: Where MLflow keeps runs (a server or a store); MLflow's default
            (``$MLFLOW_TRACKING_URI``) if None.
        registry_uri: The model registry's URI, if not the tracking URI.
        experiment_name: The experiment of the trials' runs, created if missing
            (``$MLFLOW_EXPERIMENT_NAME`` if None).
        tags: Tags for every trial's run (each also gets ``trial_name``).
        tracking_token: A token for the MLflow server (set as ``MLFLOW_TRACKING_TOKEN``).
        save_artifact: Upload each trial's directory (its checkpoints) as the run's artifacts
            when it ends.
        log_params_on_trial_end: Log the config when the trial ends, not when it starts.
    """

    service = "MLflow"

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        if tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
        self._experiment_id: str | None = None
        self._lock = threading.Lock()

    def is_transient(self, error: Exception) -> bool:
        return is_transient(error)

    def _client(self) -> MlflowClient:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)

    def _experiment(self, client: MlflowClient) -> str:
        with self._lock:
            if self._experiment_id is None:
                self._experiment_id = experiment_id_of(
                    client, None, self.experiment_name, create=True
                )
            return self._experiment_id

    def on_trial_start(self, trial: search.Trial) -> None:
        """Remember the trial in its thread; its MLflow run is made by the first record."""
        _TRIAL.set(_TrialRun(trial.name, dict(trial.config)))

    def on_start(self, run: RunInfo) -> None:
        """The trial's MLflow run: the one this trial's directory already has running (a
        restored search, a record tried again), else a new one; its config logged."""
        trial = _TRIAL.get()
        if trial is None:  # a TorchTrainer's run, no trial: one MLflow run of its own
            trial = _TrialRun(run.name, {}, plain=True)
            _TRIAL.set(trial)  # for the records after this one, delivered in this context
        client = self._client()
        if trial.run_id is None:
            experiment = self._experiment(client)
            running = client.search_runs(
                [experiment], "attributes.status = 'RUNNING'", max_results=1000
            )
            found = [r for r in running if r.data.tags.get(TRIAL_PATH_TAG) == run.path]
            if found:
                trial.run_id = found[0].info.run_id
            else:
                tags = {**self.tags, "trial_name": trial.name, TRIAL_PATH_TAG: run.path}
                created = client.create_run(experiment, tags=tags, run_name=trial.name)
                trial.run_id = created.info.run_id
        if not self.log_params_on_trial_end:
            self._log_params(client, trial)

    def on_report(self, report: Report) -> None:
        """The report's numeric metrics at step ``timesteps_total``, else its
        ``training_iteration``."""
        from mlflow.entities import Metric

        trial = _TRIAL.get()
        if trial is None or trial.run_id is None:
            return
        metrics = numeric({**report.metrics, "training_iteration": report.index + 1})
        step = int(metrics.get("timesteps_total") or metrics["training_iteration"])
        stamp = trial.stamps.setdefault(report.index, int(time.time() * 1000))  # kept: a retry
        logged = [Metric(key, value, stamp, step) for key, value in metrics.items()]
        self._client().log_batch(trial.run_id, metrics=logged)

    def on_end(self, result: Result) -> None:
        """A run that is no trial ends its MLflow run (a trial's ends with the trial)."""
        known = _TRIAL.get()
        if known is not None and known.plain and known.run_id is not None:
            status = "FAILED" if result.error is not None else "FINISHED"
            self._client().set_terminated(known.run_id, status)

    def on_trial_end(self, trial: search.Trial) -> None:
        """End the trial's run: FAILED if the trial failed, else FINISHED (a stopped or pruned
        trial too, as in Ray); its directory uploaded with ``save_artifact``. MLflow out of
        reach leaves the run RUNNING, with a warning: never the trial's failure."""
        known = _TRIAL.get()
        if known is None or known.run_id is None:
            logger.warning("MLflow: trial %s has no MLflow run to end", trial.name)
            return
        try:
            client = self._client()
            if self.log_params_on_trial_end:
                self._log_params(client, known)
            if self.should_save_artifact and trial.result is not None and trial.result.path:
                self._save_artifacts(client, known.run_id, trial)
            status = "FAILED" if trial.state == "failed" else "FINISHED"
            client.set_terminated(known.run_id, status)
        except Exception as error:
            logger.warning(
                "MLflow: the run %s of trial %s could not be ended (%s); it stays RUNNING",
                known.run_id,
                trial.name,
                error,
            )

    def _log_params(self, client: MlflowClient, trial: _TrialRun) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)) for key, value in flatten(trial.config).items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 parameters a batch
            client.log_batch(trial.run_id or "", params=params[start : start + 100])

    def _save_artifacts(self, client: MlflowClient, run_id: str, trial: search.Trial) -> None:
        result = trial.result
        assert result is not None
        with tempfile.TemporaryDirectory() as local:
            result.filesystem.get(result.path.rstrip("/") + "/", local, recursive=True)
            client.log_artifacts(run_id, local)


class _NoopModule(ModuleType):
    """What ``setup_mlflow`` returns on a rank that does not log: every call does nothing."""

    def __init__(self) -> None:
        super().__init__("mlflow_noop")

    def __getattr__(self, name: str) -> Any:
        return _NoopModule()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_mlflow(
    config: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> ModuleType:
    """Set MLflow up in a training function (Ray's ``setup_mlflow``) and return ``mlflow``.

    The experiment is ``experiment_id`` if it exists, else ``experiment_name`` (by default the
    trial's id and name, as Ray's), created only with ``create_experiment_if_not_exists``; a
    run named ``run_name`` (default: the experiment's name) is started as MLflow's active run,
    with ``config`` as its parameters. With ``rank_zero_only``, ranks other than 0 get a module
    whose calls do nothing, so a group logs once.

    Raises:
        ValueError: No such experiment, and it is not to be created.
    """
    import mlflow

    from trainlib.context import get_context
    from trainlib.tune.context import get_context as get_trial_context

    trial_id = trial_name = None
    try:
        rank = get_context().get_world_rank()
    except RuntimeError:  # outside a training function: no trial to name it after
        rank = 0
    else:
        trial = get_trial_context()
        trial_id, trial_name = trial.get_trial_id(), trial.get_trial_name()
    if rank_zero_only and rank != 0:
        return _NoopModule()
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    if tracking_uri is not None:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri is not None:
        mlflow.set_registry_uri(registry_uri)
    client = mlflow.MlflowClient()
    experiment = experiment_id_of(
        client,
        experiment_id or trial_id,
        experiment_name or trial_name,
        create_experiment_if_not_exists,
        artifact_location,
    )
    if mlflow.active_run() is None:
        name = run_name or experiment_name or trial_name
        mlflow.start_run(run_name=name, experiment_id=experiment, tags=tags)
    mlflow.log_params(flatten(config or {}))
    return mlflow
