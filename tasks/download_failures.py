"""Why a download failed, in plain words, whether trying again may help, and what to do:
the error a download of the archive ends with (``DownloadError``)."""

from __future__ import annotations

from urllib.parse import urlparse

from cifar.errors import PipelineError


class DownloadError(PipelineError):
    """The archive could not be downloaded.

    Attributes:
        url: What was downloaded.
        cause: The cause in plain words ("name resolution failed", "HTTP 404 Not Found").
        transient: The network may recover (it was retried); otherwise retrying cannot help.
        tries: How often the download was tried.
    """

    def __init__(self, url: str, cause: str, transient: bool, tries: int, advice: str) -> None:
        super().__init__(url, cause, transient, tries, advice)  # all of them: it pickles
        self.url, self.cause, self.transient, self.tries = url, cause, transient, tries
        self.advice = advice

    def __str__(self) -> str:
        host = urlparse(self.url).hostname or self.url
        if self.transient:
            what = f"Cannot reach {host} ({self.cause}) after {self.tries} tries."
        else:
            what = f"Cannot download {self.url}: {self.cause}."
        return f"{what} {self.advice}".strip()


class RedirectRefused(Exception):
    """The server redirected a download that was to follow none."""


def describe_failure(exc: BaseException) -> tuple[str, bool]:
    """The cause of a failed download in plain words, and whether trying again may help.

    fsspec wraps network errors (in a FileNotFoundError for HTTP); the cause is the most
    specific one found along the exception's chain.
    """
    chain = _chain(exc)
    for error in chain:
        if (status := _http_status(error)) is not None:
            reason = getattr(error, "message", "") or ""
            return f"HTTP {status} {reason}".strip(), status >= 500 or status == 429
    names = {type(error).__name__ for error in chain}
    for cause, matches in _NETWORK_CAUSES:
        classes = tuple(m for m in matches if isinstance(m, type))
        if any(isinstance(error, classes) for error in chain) or names & set(_names(matches)):
            return cause, True
    if isinstance(exc, RedirectRefused):
        return str(exc), False
    if isinstance(exc, PermissionError):
        return f"access denied ({exc})", False
    if isinstance(exc, FileNotFoundError):
        return "no such file", False
    return f"{type(exc).__name__}: {exc}", False


# Most specific first: aiohttp's connector errors wrap the OS error that says what happened.
_NETWORK_CAUSES: tuple[tuple[str, tuple[type[BaseException] | str, ...]], ...] = (
    ("name resolution failed", ("gaierror", "ClientConnectorDNSError")),
    ("connection refused", (ConnectionRefusedError,)),
    (
        "connection reset",
        (ConnectionResetError, BrokenPipeError, "ServerDisconnectedError", "ClientPayloadError"),
    ),
    ("timed out", (TimeoutError, "ServerTimeoutError", "ConnectTimeoutError", "ReadTimeoutError")),
    ("cannot connect to the endpoint", ("EndpointConnectionError", "ConnectionClosedError")),
    ("cannot connect", ("ClientConnectorError", "ClientOSError")),
)


def _names(matches: tuple[type[BaseException] | str, ...]) -> list[str]:
    return [m for m in matches if isinstance(m, str)]


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


def _http_status(error: BaseException) -> int | None:
    status = getattr(error, "status", None)
    if type(error).__name__ == "ClientResponseError" and isinstance(status, int):
        return status
    return None


def advice(cause: str, transient: bool) -> str:
    """What to do about a failed download with this ``cause``."""
    if transient:
        return (
            "Check the network, or train offline: `make run-offline`, or "
            "`--data-url file:///path/to/cifar-10-python.tar.gz`."
        )
    if cause.startswith(("HTTP 404", "no such file")):
        return "Check data_url: it must point at cifar-10-python.tar.gz."
    if cause.startswith(("HTTP 401", "HTTP 403", "access denied")):
        return "Check that the credentials in the environment may read data_url."
    return "Check data_url."
