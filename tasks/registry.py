"""The MLflow model registry: register a trained model, promote it, load it by alias."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import mlflow
import numpy as np
import torch
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.artifacts import create_markdown_artifact
from torch import nn

from tasks.preprocess import read_manifest
from tasks.train import TrainedRun, load_checkpoint_model

logger = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
_REQUIREMENTS = [f"torch=={torch.__version__.split('+')[0]}", "torchvision", "numpy"]


class ModelNotFoundError(LookupError):
    """The registry has no such model, version or alias."""


@dataclass(frozen=True)
class Promotion:
    """The promotion decision for one model version."""

    version: str
    alias: str
    promoted: bool
    reason: str


def register_model(model: nn.Module, run_id: str, model_name: str) -> str:
    """Log ``model`` as the run's MLflow model and register it; return the new version.

    The model takes uint8 images (N, 3, 32, 32) and returns (N, 10) class scores.
    """
    example = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    with torch.no_grad():
        scores = model.eval()(torch.from_numpy(example)).numpy()
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(
            model,
            name="model",
            signature=infer_signature(example, scores),
            input_example=example,
            serialization_format="pickle",  # "pt2" loads as a GraphModule without .eval()
            pip_requirements=_REQUIREMENTS,
            registered_model_name=model_name,
        )
    version = str(info.registered_model_version)
    logger.info("Registered %s version %s", model_name, version)
    return version


def version_at_alias(model_name: str, alias: str) -> str | None:
    """The version holding ``alias``, or None."""
    try:
        return str(MlflowClient().get_model_version_by_alias(model_name, alias).version)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(exc).lower():
            return None
        raise


def load_model(model_name: str, alias: str) -> tuple[nn.Module, str]:
    """The registered model at ``alias`` and its version.

    Raises:
        ModelNotFoundError: No version of ``model_name`` has the alias.
    """
    version = version_at_alias(model_name, alias)
    if version is None:
        raise ModelNotFoundError(
            f"Model {model_name!r} has no version with alias @{alias}; train one first "
            f"(flow train-cifar) or pick an existing alias (e.g. @{CHAMPION})."
        )
    return mlflow.pytorch.load_model(f"models:/{model_name}/{version}"), version


def promote(model_name: str, version: str, test_accuracy: float, margin: float) -> Promotion:
    """Give ``version`` the champion alias if it beats the champion by ``margin``.

    Otherwise it becomes the challenger. The reason is recorded on the version.
    """
    client = MlflowClient()
    champion = version_at_alias(model_name, CHAMPION)
    if champion is None:
        promoted, reason = True, "no champion yet"
    else:
        tags = client.get_model_version(model_name, champion).tags
        best = float(tags.get("test_accuracy", "nan"))
        promoted = math.isnan(best) or test_accuracy > best + margin  # NaN: never evaluated
        verb = "beats" if promoted else "does not beat"
        reason = (
            f"test accuracy {test_accuracy:.4f} {verb} champion version {champion} "
            f"({best:.4f}) by more than the margin {margin:g}"
        )
    alias = CHAMPION if promoted else CHALLENGER
    client.set_registered_model_alias(model_name, alias, version)
    client.set_model_version_tag(model_name, version, "promotion", f"@{alias}: {reason}")
    logger.info("%s version %s -> @%s (%s)", model_name, version, alias, reason)
    return Promotion(version, alias, promoted, reason)


@task(name="register", retries=2, retry_delay_seconds=2)
def register_task(trained: TrainedRun, dataset_uri: str, model_name: str) -> str:
    """Register the best checkpoint of a training run as a new model version."""
    model = load_checkpoint_model(trained.outcome.best_checkpoint_uri, read_manifest(dataset_uri))
    return register_model(model, trained.run_id, model_name)


@task(name="promote", retries=2, retry_delay_seconds=2)
def promote_task(model_name: str, version: str, test_accuracy: float, margin: float) -> Promotion:
    """Promote or not, and say why in a Prefect artifact."""
    decision = promote(model_name, version, test_accuracy, margin)
    create_markdown_artifact(
        key="promotion",
        markdown=(
            f"# {model_name} version {version}: @{decision.alias}\n\n"
            f"{'Promoted' if decision.promoted else 'Not promoted'}: {decision.reason}."
        ),
        description="Promotion decision",
    )
    return decision
