"""What a run shows in the Prefect UI: progress, per-epoch metrics, summary, flow-run tags."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import runtime, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import get_client

import trainlib
from mlops.outages import is_transient, outage_tolerance_s

PROGRESS_KEY = "train-progress"
METRICS_KEY = "epoch-metrics"
SUMMARY_KEY = "train-cifar-summary"


@contextmanager
def pipeline_info_logs() -> Iterator[None]:
    """Let the pipeline's INFO lines (trainlib's states, rank 0's epochs) through while a task
    runs: Prefect sends them to the task's logs (PREFECT_LOGGING_EXTRA_LOGGERS names them),
    but leaves their loggers at the root's WARNING."""
    loggers = [logging.getLogger(name) for name in ("trainlib", "cifar", "mlops", "tasks")]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)


class PrefectProgressCallback(trainlib.TrackingCallback):
    """Updates a progress artifact and a table of per-epoch metrics at every report.

    A tracker: an outage of the Prefect API never stops or holds the training; the artifacts
    wait and are written, in order, when it answers again (``trainlib.TrackingCallback``).
    """

    service = "the Prefect API"

    def __init__(self, epochs: int) -> None:
        self._epochs = epochs
        self._progress_id: Any = None
        self._rows: dict[int, dict[str, Any]] = {}  # by report: a retried one is a row once
        self.outage_tolerance_s = outage_tolerance_s()

    def is_transient(self, error: Exception) -> bool:
        return is_transient(error)

    def on_start(self, run: trainlib.RunInfo) -> None:
        if self._progress_id is None:
            self._progress_id = create_progress_artifact(
                progress=0.0, key=PROGRESS_KEY, description=f"Epochs done, run {run.name}"
            )

    def on_report(self, report: trainlib.Report) -> None:
        epoch = int(report.metrics.get("epoch", report.index))
        self._rows[report.index] = {
            k: round(v, 4) if isinstance(v, float) else v for k, v in report.metrics.items()
        }
        if self._progress_id is not None:
            update_progress_artifact(
                self._progress_id, progress=min(100.0, 100.0 * (epoch + 1) / self._epochs)
            )
        create_table_artifact(
            key=METRICS_KEY,
            table=[self._rows[index] for index in sorted(self._rows)],
            description="Metrics reported by rank 0 at the end of each epoch",
        )


def tag_flow_run(tags: dict[str, str]) -> None:
    """Add ``key:value`` tags to the current flow run (shown and filterable in the UI)."""
    flow_run_id = runtime.flow_run.id
    if flow_run_id is None:
        return
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run_id).tags
        labels = {f"{key}:{value}" for key, value in tags.items()}
        client.update_flow_run(flow_run_id, tags=sorted(set(current) | labels))


def mlflow_links(
    tracking_uri: str, experiment_id: str, run_id: str, model_name: str, version: str
) -> tuple[str, str]:
    """Markdown links (or, without an MLflow server, how to look) to the run and version."""
    if tracking_uri.startswith("http"):
        base = tracking_uri.rstrip("/")
        return (
            f"[run {run_id}]({base}/#/experiments/{experiment_id}/runs/{run_id})",
            f"[{model_name} v{version}]({base}/#/models/{model_name}/versions/{version})",
        )
    hint = f"(`mlflow ui --backend-store-uri {tracking_uri}`)"
    return f"run `{run_id}` {hint}", f"`{model_name}` version {version} {hint}"


@task(name="summarize")
def summarize_task(summary: dict[str, Any], tracking_uri: str, promotion_reason: str) -> None:
    """A markdown summary of the run: result, links to MLflow, the promotion decision."""
    run = MlflowClient(tracking_uri).get_run(summary["mlflow_run_id"])
    run_link, version_link = mlflow_links(
        tracking_uri,
        run.info.experiment_id,
        run.info.run_id,
        summary["model_name"],
        summary["model_version"],
    )
    verdict = "promoted to `@champion`" if summary["promoted"] else "kept as `@challenger`"
    create_markdown_artifact(
        key=SUMMARY_KEY,
        description="train-cifar result",
        markdown="\n".join(
            [
                "# train-cifar",
                f"- MLflow: {run_link}",
                f"- Model: {version_link}, {verdict}: {promotion_reason}",
                f"- Test accuracy: **{summary['test_accuracy']:.4f}**",
                f"- Data checksum verified: {summary['data_verified']}",
                *(
                    [
                        f"- **Synthetic data**: registered as `{summary['model_name']}`, "
                        "never promoted over a model trained on real data"
                    ]
                    if summary.get("synthetic_data")
                    else []
                ),
            ]
        ),
    )
