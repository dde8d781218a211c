"""The tail train-cifar and tune-cifar share: register → evaluate → promote → summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cifar.dataset import Dataset
from tasks.download import Archive
from tasks.evaluate import evaluate_task
from tasks.monitoring import run_summary, summarize_task
from tasks.registry import promote_task, register_task
from tasks.results import TrainedRun


def publish(
    trained: TrainedRun,
    archive: Archive,
    dataset: Dataset,
    model_name: str,
    promote_margin: float,
    tracking_uri: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Register the run's best checkpoint as a version of ``model_name``, evaluate it on the
    test split, promote it to ``@champion`` if it beats the champion by ``promote_margin``.

    Returns the run's summary (with ``extra`` merged in), also shown in Prefect and MLflow.
    """
    version = register_task(trained.best_checkpoint_uri, trained.run_id, model_name, tracking_uri)
    evaluation = evaluate_task(model_name, version, dataset, trained.run_id, tracking_uri)
    promotion = promote_task(model_name, version, evaluation.accuracy, promote_margin, tracking_uri)
    summary = run_summary(trained, model_name, version, evaluation, promotion, archive)
    summary.update(extra or {})
    summarize_task(summary, tracking_uri, promotion.reason)
    return summary
