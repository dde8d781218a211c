"""The tail train-cifar and tune-cifar share: register → evaluate → promote, all or nothing, then
the summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect.transactions import transaction

from cifar.dataset import Dataset
from cifar.errors import PipelineError
from mlops.alias_moves import Promotion
from mlops.evaluation import Evaluation
from mlops.promotion import PromotionRule
from mlops.tracking import run_recipe
from tasks.download import Archive
from tasks.evaluate import champion_score_task, evaluate_task
from tasks.monitoring import summarize_task
from tasks.promotion import promote_task
from tasks.registry import publish_queue_task, register_task, sweep_task
from tasks.train import TrainedRun


class PublishError(PipelineError):
    """Registering, evaluating or promoting a new model version failed; what was done is undone
    (the version withdrawn, the aliases where they were).

    Attributes:
        model_name: The registered model.
        version: The version that was registered and removed again (None: none was).
        cause: The failure, in one line.
    """

    def __init__(self, model_name: str, version: str | None, cause: str) -> None:
        super().__init__(model_name, version, cause)  # all of them: it pickles
        self.model_name, self.version, self.cause = model_name, version, cause

    def __str__(self) -> str:
        undone = (
            f"version {self.version} was withdrawn (tag 'withdrawn')"
            if self.version is not None
            else "no version was registered"
        )
        return (
            f"Publishing the trained model as {self.model_name!r} failed: "
            f"{self.cause.rstrip('.')}. "
            f"Nothing was published: {undone} and no alias moved (@champion is unchanged). "
            "The MLflow run and its checkpoints are kept; fix the cause and run the flow again "
            "with the same run_name to publish it without training again."
        )


def publish(
    trained: TrainedRun,
    archive: Archive,
    dataset: Dataset,
    model_name: str,
    rule: PromotionRule,
    tracking_uri: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Register the run's best checkpoint as a version of ``model_name`` (as the flow named it:
    ``mlops.registry.model_name_for``), evaluate it on the test split, promote it to
    ``@champion`` if it passes the release gates and beats the champion on the same images as
    ``rule`` asks (``mlops.promotion``).

    The three steps are one Prefect transaction: if one fails, the version is withdrawn (tagged
    ``withdrawn``) and the aliases stay where they were. Before them, the versions of earlier
    publishes that never finished (killed mid-way) are withdrawn. Publications of one model
    are judged one at a time, in version order (``mlops.publish_queue``): the champion is read
    and the ledger's place taken only once every earlier version has finished.

    Returns the run's summary (with ``extra`` merged in), also shown in Prefect and MLflow.

    Raises:
        PublishError: A step failed; nothing was published.
    """
    synthetic = dataset.manifest.synthetic
    sweep_task(model_name, tracking_uri)  # versions of publishes that never finished: withdrawn
    version: str | None = None
    try:
        with transaction():
            version = register_task(
                trained.best_checkpoint_uri, trained.run_id, model_name, tracking_uri, dataset
            )
            evaluation = evaluate_task(
                model_name, version, dataset, tracking_uri, rule.check_fresh_load
            )
            publish_queue_task(model_name, version, tracking_uri)  # earlier versions first
            champion = champion_score_task(model_name, dataset, tracking_uri)
            promotion = promote_task(
                model_name,
                version,
                evaluation,
                rule,
                tracking_uri,
                champion,
                dataset,
                run_recipe(tracking_uri, trained.run_id, dataset.manifest.digest()),
            )
    except Exception as exc:
        raise PublishError(model_name, version, f"{type(exc).__name__}: {exc}") from exc
    summary = run_summary(trained, model_name, version, evaluation, promotion, archive)
    summary.update({"synthetic_data": synthetic, **(extra or {})})
    summarize_task(summary, tracking_uri, promotion.reason)
    return summary


def run_summary(
    trained: TrainedRun,
    model_name: str,
    version: str,
    evaluation: Evaluation,
    promotion: Promotion,
    archive: Archive,
) -> dict[str, Any]:
    """What ``train-cifar`` returns and prints: the run, the version and what became of it."""
    return {
        "mlflow_run_id": trained.run_id,
        "model_name": model_name,
        "model_version": version,
        "test_accuracy": evaluation.accuracy,
        "promoted": promotion.promoted,
        "alias": promotion.alias,
        "data_verified": archive.verified,
    }
