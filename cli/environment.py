"""The environment a command sets before Prefect is imported: offline-safe, quiet, and logging
the run's own lines."""

from __future__ import annotations

import os

ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib,cifar,tasks",  # rank 0's lines reach the flow
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # records of Dask's threads
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",  # a busy 2-core machine
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DASK_LOGGING__DISTRIBUTED": "warning",  # read when distributed is imported (in a task)
}


def set_environment() -> None:
    """The settings above, where the user has not set them."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
