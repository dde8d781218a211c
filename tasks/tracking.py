"""The tracking step run while the data is prepared: the MLflow experiment made ready."""

from __future__ import annotations

from prefect import task

from mlops.tracking import prepare_experiment

prepare_experiment_task = task(name="prepare-tracking", retries=2, retry_delay_seconds=2)(
    prepare_experiment
)
