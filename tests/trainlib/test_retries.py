from __future__ import annotations

import errno
import logging
import pickle

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from s3fs.errors import translate_boto_error

from trainlib import CheckpointError
from trainlib import _retries as retries


def _s3_error(status: int, code: str) -> OSError:
    """The error s3fs raises for an S3 answer with ``status``: botocore's, translated."""
    response = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    error: OSError = translate_boto_error(ClientError(response, "PutObject"))  # type: ignore[arg-type]
    return error


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (_s3_error(503, "SlowDown"), True),
        (_s3_error(500, "InternalError"), True),
        (_s3_error(429, "TooManyRequests"), True),
        (_s3_error(403, "AccessDenied"), False),
        (_s3_error(404, "NoSuchKey"), False),
        (ConnectionResetError(errno.ECONNRESET, "reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (FileExistsError(errno.EEXIST, "exists"), False),
    ],
)
def test_retries_tell_transient_errors_from_permanent_ones(
    error: BaseException, transient: bool
) -> None:
    assert retries.is_transient(error) is transient


def test_retries_retry_a_transient_error_and_log_each_retry(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "FIRST_WAIT_S", 0.001)
    failures = [_s3_error(503, "SlowDown"), ConnectionResetError("reset")]

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    with caplog.at_level(logging.WARNING, logger=retries.__name__):
        assert retries.call_storage("upload the checkpoint to", "s3://b/run", flaky) == "done"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("Could not upload the checkpoint to s3://b/run (OSError")
    last = retries.ATTEMPTS - 1
    assert f"retry 1 of {last}" in messages[0] and f"retry 2 of {last}" in messages[1]


def test_retries_fail_a_permanent_error_at_once_naming_the_path() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise _s3_error(403, "AccessDenied")

    with pytest.raises(CheckpointError, match="check the storage credentials") as raised:
        retries.call_storage("upload the checkpoint to", "s3://b/run/checkpoint_000001", denied)
    assert calls == [1]
    assert str(raised.value).startswith(
        "Could not upload the checkpoint to s3://b/run/checkpoint_000001: PermissionError"
    )
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)


def test_retries_give_up_after_the_last_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries, "FIRST_WAIT_S", 0.001)
    monkeypatch.setattr(retries, "ATTEMPTS", 3)
    calls = []

    def down() -> None:
        calls.append(1)
        raise _s3_error(503, "SlowDown")

    with pytest.raises(CheckpointError, match="still after 3 attempts"):
        retries.call_storage("read", "s3://b/x", down)
    assert len(calls) == 3


def test_retries_leave_expected_errors_to_the_caller() -> None:
    def missing() -> None:
        raise FileNotFoundError("s3://b/x/.trainlib-commit.json")

    with pytest.raises(FileNotFoundError):
        retries.call_storage("read", "s3://b/x", missing, (FileNotFoundError,))
