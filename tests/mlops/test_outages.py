"""Which failures are an outage (storage or a server out of reach, never bad input), and how
long a run rides one out."""

from __future__ import annotations

import errno

import aiohttp
import botocore.exceptions
import httpx
import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE

from cifar.errors import InvalidParameterError
from mlops.outages import OUTAGE_TOLERANCE_VARIABLE, is_transient, outage_tolerance_s
from tasks.download import ChecksumError


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "PutObject")  # type: ignore[arg-type]


def _caused(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        TimeoutError("timed out"),
        OSError(errno.EHOSTUNREACH, "no route to host"),
        _client_error(503, "SlowDown"),
        _client_error(500, "InternalError"),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3:9000"),
        requests.ConnectionError("Max retries exceeded"),
        MlflowException("down for a moment", error_code=TEMPORARILY_UNAVAILABLE),
        _caused(RuntimeError("while reading the dataset"), ConnectionResetError("reset")),
        httpx.ConnectError("All connection attempts failed"),  # the Prefect API is down
        httpx.HTTPStatusError(
            "503", request=httpx.Request("GET", "http://p"), response=httpx.Response(503)
        ),
    ],
    ids=lambda e: type(e).__name__,
)
def test_retrying_an_outage_is_transient(error: BaseException) -> None:
    assert is_transient(error)


def test_retrying_aiohttps_connection_errors_are_transient() -> None:
    assert is_transient(aiohttp.ServerDisconnectedError())


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError(errno.ENOENT, "no such file"),
        PermissionError(errno.EACCES, "access denied"),
        _client_error(403, "AccessDenied"),
        _client_error(404, "NoSuchBucket"),
        MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST),
        MlflowException("a bug of ours"),  # a plain one: INTERNAL_ERROR, 500, and no outage
        ValueError("bad shape"),
        InvalidParameterError("unknown model"),
        _caused(ChecksumError("wrong md5"), ConnectionResetError("reset")),
        httpx.HTTPStatusError(
            "404", request=httpx.Request("GET", "http://p"), response=httpx.Response(404)
        ),
    ],
    ids=lambda e: type(e).__name__,
)
def test_retrying_a_bad_input_or_a_bug_is_not(error: BaseException) -> None:
    assert not is_transient(error)


def test_outages_tolerance_is_15_minutes_unless_the_worker_sets_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OUTAGE_TOLERANCE_VARIABLE, raising=False)
    assert outage_tolerance_s() == 900.0
    monkeypatch.setenv(OUTAGE_TOLERANCE_VARIABLE, "120")
    assert outage_tolerance_s() == 120.0
    monkeypatch.setenv(OUTAGE_TOLERANCE_VARIABLE, "15m")
    with pytest.raises(ValueError, match="CIFAR_OUTAGE_TOLERANCE_S='15m' must be a positive"):
        outage_tolerance_s()
