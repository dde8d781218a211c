"""Which failures of a pipeline step are worth a retry: storage or a server briefly out of
reach (a connection refused or reset, a timeout, HTTP 429 or 5xx from S3 or MLflow), never a
bad input (a ``PipelineError`` says what the user must change; a retry would fail the same way).

The steps that read or write storage or the registry retry with Prefect's own task retries:
``@task(..., **TRANSIENT_RETRIES)``.
"""

from __future__ import annotations

import errno
from typing import Any

import aiohttp
import botocore.exceptions
import requests
from mlflow.exceptions import MlflowException

from cifar.errors import PipelineError

RETRIES = 3
RETRY_DELAYS_S = [2.0, 10.0, 30.0]
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
TRANSIENT_ERRNO = frozenset(
    {errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH}
)
TRANSIENT_MLFLOW = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"})
TRANSIENT_S3 = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"})


def _transient_itself(error: BaseException) -> bool:
    if isinstance(error, (ConnectionError, TimeoutError, aiohttp.ClientConnectionError)):
        return True
    if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNO:
        return True
    if isinstance(
        error, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)
    ):
        return True
    if isinstance(error, botocore.exceptions.ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (
            status in TRANSIENT_HTTP or error.response.get("Error", {}).get("Code") in TRANSIENT_S3
        )
    if isinstance(error, (requests.ConnectionError, requests.Timeout)):
        return True  # MLflow's client, after its own retries
    if isinstance(error, MlflowException):  # not by its status: a plain one is a 500 too
        return error.error_code in TRANSIENT_MLFLOW
    return False


def is_transient(error: BaseException) -> bool:
    """Whether ``error``, or an error that caused it, is a transient one (not a bad input)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, PipelineError):
            return False  # our own verdict: its message says what to change
        if _transient_itself(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def transient_failure(task: object, task_run: object, state: Any) -> bool:
    """A Prefect ``retry_condition_fn``: retry the task only after a transient failure."""
    try:
        state.result()
    except Exception as error:
        return is_transient(error)
    return False


TRANSIENT_RETRIES: dict[str, Any] = {
    "retries": RETRIES,
    "retry_delay_seconds": RETRY_DELAYS_S,
    "retry_condition_fn": transient_failure,
}
