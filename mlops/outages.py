"""Outages of the services a run uses (MLflow, S3, the Prefect API): which errors are one, and
how long a run rides one out.

A transient error (a connection refused or reset, a timeout, HTTP 429 or 5xx from S3 or
MLflow) says the service is out of reach for now; a bad input never is (a ``PipelineError``
says what the user must change; a retry would fail the same way). A run rides through an outage
of up to ``outage_tolerance_s()``: its tracking waits for the service off the training's path,
and the steps after training (register, evaluate, promote) retry within that time.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import aiohttp
import botocore.exceptions
import httpx
import requests
from mlflow.exceptions import MlflowException

from cifar.errors import PipelineError

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The operator's bound, set in the worker's environment (the stack's .env: CIFAR_OUTAGE_TOLERANCE_S)
OUTAGE_TOLERANCE_VARIABLE = "CIFAR_OUTAGE_TOLERANCE_S"
DEFAULT_OUTAGE_TOLERANCE_S = 900.0
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
TRANSIENT_ERRNO = frozenset(
    {errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH}
)
TRANSIENT_MLFLOW = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"})
TRANSIENT_S3 = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"})


def outage_tolerance_s() -> float:
    """How long an outage a run rides through: ``$CIFAR_OUTAGE_TOLERANCE_S``, else 15 minutes."""
    configured = os.environ.get(OUTAGE_TOLERANCE_VARIABLE)
    if not configured:
        return DEFAULT_OUTAGE_TOLERANCE_S
    try:
        value = float(configured)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(
            f"{OUTAGE_TOLERANCE_VARIABLE}={configured!r} must be a positive number of seconds "
            f"(default {DEFAULT_OUTAGE_TOLERANCE_S:g}); fix the worker's environment"
        )
    return value


def _transient_itself(error: BaseException) -> bool:
    if isinstance(error, (ConnectionError, TimeoutError, aiohttp.ClientConnectionError)):
        return True
    if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNO:
        return True
    if isinstance(error, (httpx.TransportError,)):  # the Prefect API's client
        return True
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code in TRANSIENT_HTTP
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


def ride_out(call: Callable[[], T], what: str, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, tried again while it fails transiently, for up to ``outage_tolerance_s()``
    (after 1 s, then doubling up to 30 s; each retry logged with ``what``); the last error is
    raised."""
    tolerance = outage_tolerance_s()
    started, delay = time.monotonic(), 1.0
    while True:
        try:
            return call()
        except Exception as error:
            if not is_transient(error) or time.monotonic() - started + delay > tolerance:
                raise
            logger.warning(
                "Could not %s (%s: %s); the service is out of reach, tried again in %.0f s",
                what,
                type(error).__name__,
                str(error)[:200],
                delay,
            )
        sleep(delay)
        delay = min(delay * 2, 30.0)
