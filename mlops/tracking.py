"""MLflow tracking: one run per training run, created by the driver, fed by trainlib callbacks.

Every function takes the tracking URI: nothing depends on a process-wide MLflow setting.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from mlflow.entities import Metric, RunStatus
from mlflow.tracking import MlflowClient

import trainlib
from mlops import ledger, outages

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def resolve_tracking_uri(tracking_uri: str | None) -> str:
    """``tracking_uri``, else $MLFLOW_TRACKING_URI, else ``mlflow.db`` in the current folder
    (as an absolute path, so every task and process uses the same file)."""
    chosen = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if chosen.startswith("sqlite:///") and not chosen.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(chosen.removeprefix("sqlite:///"))
    return chosen


GIT_SHA_VARIABLE = "CIFAR_GIT_SHA"  # set in the image: the commit it was built from


def git_sha() -> str:
    """The commit of the code that runs: ``$CIFAR_GIT_SHA`` (the image's), else the checkout's,
    else "unknown"."""
    if built := os.environ.get(GIT_SHA_VARIABLE):
        return built
    source_dir = os.path.dirname(os.path.abspath(__file__))
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=source_dir,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def _artifact_location(tracking_uri: str) -> str | None:
    """For a sqlite store, ``mlruns`` beside the database file; MLflow's default is ./mlruns
    of whatever folder the process runs in (a Prefect worker's, say)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = os.path.abspath(tracking_uri.removeprefix("sqlite:///"))
    return Path(database).parent.joinpath("mlruns").as_uri()


TRAINING_RUN_TAG = "training_run"


def prepare_experiment(tracking_uri: str, experiment: str) -> str:
    """The id of ``experiment``, created if needed (with a new sqlite store: its tables too,
    which takes seconds, so the flow does it while the data is prepared)."""
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found:
        return str(found.experiment_id)
    return str(
        client.create_experiment(experiment, artifact_location=_artifact_location(tracking_uri))
    )


def create_sqlite_store(tracking_uri: str) -> None:
    """Create a new sqlite store's tables now (MLflow migrates its schema: seconds of CPU);
    nothing for an existing file or another kind of store."""
    path = tracking_uri.removeprefix("sqlite:///")
    if tracking_uri.startswith("sqlite:///") and not os.path.exists(path):
        MlflowClient(tracking_uri).search_experiments(max_results=1)


def start_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, Any],
    tags: Mapping[str, str],
) -> str:
    """The MLflow run of training run ``run_name``: the existing one (tagged with it) when the
    run is resumed, else a new one with its params and tags. Returns its id."""
    client = MlflowClient(tracking_uri)
    experiment_id = prepare_experiment(tracking_uri, experiment)
    existing = client.search_runs(
        [experiment_id], filter_string=f"tags.{TRAINING_RUN_TAG} = '{run_name}'", max_results=1
    )
    if existing:
        client.update_run(existing[0].info.run_id, status="RUNNING")
        return str(existing[0].info.run_id)
    all_tags = {
        "git_sha": git_sha(),
        "torch_version": torch.__version__,
        **tags,
        TRAINING_RUN_TAG: run_name,
    }
    run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
    for key, value in params.items():
        client.log_param(run.info.run_id, key, value)
    return run.info.run_id


def run_recipe(tracking_uri: str, run_id: str, data_digest: str) -> str:
    """What made the training run's model (``mlops.ledger.recipe``): the data, its recorded
    commit and its params."""
    run = MlflowClient(tracking_uri).get_run(run_id)
    return ledger.recipe(data_digest, run.data.tags.get("git_sha", "unknown"), run.data.params)


class MLflowCallback(trainlib.TrackingCallback):
    """Logs every report's metrics (``step=epoch``) to an MLflow run, once.

    A tracker: an MLflow outage never stops or holds the training; the metrics wait and are
    logged, in order, when MLflow answers again (``trainlib.TrackingCallback``; the run's end
    waits up to ``outage_tolerance_s``). The checkpoints stay in the run's storage: the
    registered model is the one copy MLflow keeps.

    Logging is idempotent: a metric is never logged twice for the same step. A driver that
    dies at any instant (before, between or after the checkpoint's commit marker and the MLflow
    calls) and is run again resumes the run; then the metrics of every checkpoint kept in the
    run directory are logged if they are missing (a report still waiting for MLflow when the
    driver died is lost only if its checkpoint was not kept), and epochs trained again after
    them are logged only if they are not.
    A retried log (its reply lost) sends the same metrics with the same timestamps.
    """

    service = "MLflow"

    def __init__(
        self, tracking_uri: str, run_id: str, outage_tolerance_s: float | None = None
    ) -> None:
        self._client = MlflowClient(tracking_uri)
        self._run_id = run_id
        self._logged: dict[str, set[int]] = {}
        self._timestamps: dict[int, int] = {}  # step -> the ms its metrics are logged with
        self.outage_tolerance_s = outage_tolerance_s or outages.outage_tolerance_s()

    def is_transient(self, error: Exception) -> bool:
        return outages.is_transient(error)

    def on_start(self, run: trainlib.RunInfo) -> None:
        """Read what the run already holds; log its committed checkpoints' metrics if
        missing."""
        self._client.set_tag(self._run_id, "world_size", str(run.world_size))
        for key in self._client.get_run(self._run_id).data.metrics:
            history = self._client.get_metric_history(self._run_id, key)
            self._logged[key] = {m.step for m in history}
        for report in run.committed:  # a driver that died may not have logged them
            self._log_metrics(report.metrics, _step(report))

    def on_report(self, report: trainlib.Report) -> None:
        self._log_metrics(report.metrics, _step(report))

    def _log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        timestamp = self._timestamps.setdefault(step, int(time.time() * 1000))
        missing = [
            Metric(key, float(value), timestamp, step)
            for key, value in metrics.items()
            if key != "epoch"
            and isinstance(value, (int, float))
            and step not in self._logged.get(key, set())
        ]
        if missing:
            self._client.log_batch(self._run_id, metrics=missing)
        for metric in missing:
            self._logged.setdefault(metric.key, set()).add(step)

    def on_end(self, result: trainlib.Result) -> None:
        """The run's status is the training's (``end_status``). Later steps (evaluation)
        still add to it; it is never left RUNNING."""
        self._client.set_terminated(self._run_id, end_status(result.error))


def end_status(error: BaseException | None) -> str:
    """An MLflow run's final status after ``error``: FINISHED, KILLED (Ctrl-C) or FAILED."""
    if error is None:
        return RunStatus.to_string(RunStatus.FINISHED)
    if isinstance(error, KeyboardInterrupt):
        return RunStatus.to_string(RunStatus.KILLED)
    return RunStatus.to_string(RunStatus.FAILED)


@contextlib.contextmanager
def terminated_run(tracking_uri: str, run_id: str) -> Iterator[None]:
    """End the MLflow run after the block with ``end_status``; never leave it RUNNING."""
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        MlflowClient(tracking_uri).set_terminated(run_id, end_status(error))


def _step(report: trainlib.Report) -> int:
    """The MLflow step of a report: its epoch, else its index."""
    return int(report.metrics.get("epoch", report.index))
