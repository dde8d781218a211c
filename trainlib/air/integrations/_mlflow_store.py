"""What both MLflow integrations (``trainlib.air.integrations.mlflow``) share: metrics as
MLflow holds them (configs are flattened by ``trainlib.tune.logger.flatten``), the experiment
chosen as Ray chooses it, and which errors mean MLflow is out of reach."""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainlib.tune.logger import flatten

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

TRANSIENT_MLFLOW = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"})


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics MLflow can hold: those whose value is a number (flattened)."""
    kept: dict[str, float] = {}
    for key, value in flatten(metrics).items():
        if isinstance(value, numbers.Real):  # numpy's scalars too
            kept[key] = float(value)
    return kept


def experiment_id_of(
    client: MlflowClient,
    experiment_id: str | None,
    experiment_name: str | None,
    create: bool,
    artifact_location: str | None = None,
) -> str:
    """The experiment to log into: ``experiment_id`` if it exists, else the one named
    ``experiment_name`` (created if ``create``); with neither given, ``$MLFLOW_EXPERIMENT_ID``
    and ``$MLFLOW_EXPERIMENT_NAME`` (as Ray reads them). A name given is never overridden by
    the environment (``mlflow.set_experiment`` sets ``$MLFLOW_EXPERIMENT_ID``)."""
    from mlflow.exceptions import MlflowException

    if experiment_id is None and experiment_name is None:
        experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if experiment_id is not None:
        try:
            return str(client.get_experiment(experiment_id).experiment_id)
        except MlflowException:
            pass
    if experiment_name:
        found = client.get_experiment_by_name(experiment_name)
        if found is not None:
            return str(found.experiment_id)
        if create:
            return str(client.create_experiment(experiment_name, artifact_location))
    raise ValueError(
        f"No MLflow experiment with id {experiment_id!r} or name {experiment_name!r}: pass the "
        "name of one (experiment_name=...) or create it first"
        + ("" if create else " (or pass create_experiment_if_not_exists=True)")
    )


def is_transient(error: BaseException) -> bool:
    """MLflow out of reach for now (no connection, a timeout, its 'temporarily unavailable'),
    by the error or what caused it."""
    import requests
    from mlflow.exceptions import MlflowException

    current: BaseException | None = error
    for _ in range(10):  # a cause chain, bounded
        if current is None:
            return False
        if isinstance(current, (ConnectionError, TimeoutError, requests.ConnectionError)):
            return True
        if isinstance(current, requests.Timeout):
            return True
        if isinstance(current, MlflowException) and current.error_code in TRANSIENT_MLFLOW:
            return True
        current = current.__cause__ or current.__context__
    return False
