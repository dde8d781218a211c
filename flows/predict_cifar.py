"""The predict-cifar flow: score new images with the registered model at an alias."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.predict_output import check_output
from flows.redirects import final_url
from flows.run_policy import run_policy
from flows.time_limit import time_limit
from mlops.tracking import resolve_tracking_uri
from mlops.version_tags import CHAMPION
from tasks.predict import predict_task


@flow(name="predict-cifar", persist_result=True)  # see flows/__init__.py
def predict_cifar(
    input: str,
    output: str,
    registered_model_name: str = "cifar10-classifier",
    alias: str = CHAMPION,
    mlflow_tracking_uri: str | None = None,
    timeout_minutes: float | None = 1440.0,
) -> dict[str, Any]:
    """Write the predictions of a registered model for a set of images.

    A worker's run policy confines ``input``, ``output``, ``mlflow_tracking_uri``, the model
    and its alias (``flows.run_policy``: the pipeline's own models, ``@champion`` and
    ``@challenger``, unless the operator allows more); there ``output`` must be a new file
    outside the pipeline's own folders (``flows.predict_output``).

    Args:
        input: A folder of images, an image or a CIFAR batch file (any fsspec URL).
        output: Where the predictions go: CSV, or Parquet for ``.parquet`` (images that
            could not be read: ``<output without extension>.errors.csv``).
        registered_model_name: The model in MLflow's registry.
        alias: The version's alias.
        mlflow_tracking_uri: MLflow's server; default $MLFLOW_TRACKING_URI.
        timeout_minutes: A longer run fails (None: no limit).
    """
    with time_limit(timeout_minutes, "predict-cifar"):
        policy = run_policy()
        policy.confine(
            input=input,
            output=output,
            mlflow_tracking_uri=mlflow_tracking_uri,
            registered_model_name=registered_model_name,
            alias=alias,
        )
        check_output(output, policy)
        input = final_url("input", input, policy)
        tracking_uri = resolve_tracking_uri(mlflow_tracking_uri)
        summary = predict_task(registered_model_name, alias, input, output, tracking_uri)
        return {
            "output_uri": summary.output_uri,
            "errors_uri": summary.errors_uri,
            "num_scored": summary.num_scored,
            "num_errors": summary.num_errors,
            "model_name": summary.model_name,
            "model_version": summary.model_version,
        }
