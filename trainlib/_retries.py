"""Storage calls that survive transient errors and fail at once, clearly, on permanent ones.

Transient: HTTP 5xx, 429 and 408, a connection reset or refused, a timeout. They are tried
again with exponential backoff and full jitter (tenacity's ``wait_random_exponential``), each
retry logged, up to ``ATTEMPTS`` attempts and ``TOTAL_S`` seconds. Permanent: everything
else, e.g. HTTP 403 or 404, no space left, a read-only filesystem: no retry, one
``CheckpointError`` naming the operation and the storage path.

Inside one request the filesystem's own retries apply first (botocore's retry config for
s3fs); these retries wrap a whole operation (one checkpoint's upload, one marker), so they also
cover filesystems without retries of their own and errors that outlasted the inner ones.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from trainlib.errors import CheckpointError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A storage outage of up to five minutes (a restarted S3 gateway, a failover) is ridden through.
ATTEMPTS = 40
FIRST_WAIT_S = 0.25  # the first retry waits up to this long, doubling each time
MAX_WAIT_S = 15.0
TOTAL_S = 300.0

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_PERMANENT_ERRNO = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
# OSErrors that s3fs makes of S3's 500 (EREMOTEIO) and 503/SlowDown (EBUSY) answers
_TRANSIENT_ERRNO = frozenset({errno.EBUSY, errno.EREMOTEIO, errno.ETIMEDOUT, errno.ECONNRESET})


def call_storage(
    operation: str,
    url: str,
    call: Callable[[], T],
    expected: tuple[type[BaseException], ...] = (),
) -> T:
    """``call()``, retried while it fails transiently.

    Args:
        operation: What the call does, for messages: ``"upload the checkpoint to"``.
        url: The storage path it works on (no credentials: fsspec paths never hold them).
        call: The storage call.
        expected: Exceptions the caller handles itself (``FileNotFoundError`` for a marker
            that may be missing): raised as they are, never retried.

    Raises:
        CheckpointError: A permanent error, or transient ones past the retry budget.
    """
    retrying = Retrying(
        stop=stop_after_attempt(ATTEMPTS) | stop_after_delay(TOTAL_S),
        wait=wait_random_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S),
        retry=retry_if_exception(lambda exc: not isinstance(exc, expected) and is_transient(exc)),
        before_sleep=_log_retry(operation, url),
        reraise=True,
    )
    try:
        return retrying(call)
    except expected:
        raise
    except Exception as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise storage_error(operation, url, exc, attempts) from exc


def storage_error(
    operation: str, url: str, exc: BaseException, attempts: int = 1
) -> CheckpointError:
    """The one error a user sees for a failed storage call."""
    cause = f"{type(exc).__name__}: {exc}"
    if is_transient(exc):
        return CheckpointError(
            f"Could not {operation} {url}: {cause}, still after {attempts} attempts; the "
            "storage stayed unavailable, check its endpoint and network and run again."
        )
    return CheckpointError(f"Could not {operation} {url}: {cause}; {_hint(exc)}.")


def is_transient(exc: BaseException) -> bool:
    """True for errors worth another attempt: HTTP 5xx/429/408, resets, timeouts."""
    for error in _chain(exc):
        status = _http_status(error)
        if status is not None:
            return status in _TRANSIENT_STATUS
        if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
            return False
        if isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if _is_client_connection_error(error):
            return True
        if isinstance(error, OSError) and error.errno in _PERMANENT_ERRNO:
            return False
        if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNO:
            return True
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes: s3fs raises an OSError caused by botocore's ClientError."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _http_status(error: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError (or anything carrying its ``response``)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _is_client_connection_error(error: BaseException) -> bool:
    """botocore's and aiohttp's connection and read-timeout errors (imported only if loaded)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(
        names
        & {
            "EndpointConnectionError",
            "ConnectionClosedError",
            "ReadTimeoutError",
            "ConnectTimeoutError",
            "ClientConnectionError",
            "ServerDisconnectedError",
            "ClientPayloadError",
            "FSTimeoutError",
        }
    )


def _hint(exc: BaseException) -> str:
    for error in _chain(exc):
        status = _http_status(error)
        if status in (401, 403) or isinstance(error, PermissionError):
            return "check the storage credentials and their permissions on that path"
        if status == 404 or isinstance(error, FileNotFoundError):
            return "check that the path (and its bucket) exists"
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free space on the storage, or keep fewer checkpoints (num_to_keep)"
        if isinstance(error, OSError) and error.errno == errno.EROFS:
            return "the storage is read-only: choose a storage_path you can write"
    return "this error is not transient, so it was not retried"


def _log_retry(operation: str, url: str) -> Callable[[RetryCallState], None]:
    def log(state: RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning(
            "Could not %s %s (%s: %s); retry %d of %d in %.1f s",
            operation,
            url,
            type(exc).__name__,
            exc,
            state.attempt_number,
            ATTEMPTS - 1,
            wait,
        )

    return log
