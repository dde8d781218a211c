"""Getting the CIFAR-10 archive: a streamed copy from any fsspec URL, retried while the network
fails, verified by md5.

HTTP(S) is read as a stream: no Range requests, so any server works (``python -m http.server``,
mirrors and proxies without them), and no redirect is followed: the flow resolves them first,
each hop checked against the run policy (``flows.redirects``), so a redirect here fails the
download instead of storing what an unchecked place answered. DNS failures, refused or reset
connections, timeouts, HTTP 5xx and 429 are retried with exponential backoff; a missing file, a
refused access, a redirect, a wrong md5 fail at once. Each error says what failed, why, and
what to do.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import fsspec
from prefect import task

from cifar.errors import PipelineError
from cifar.format import OFFICIAL_MD5, OFFICIAL_URL
from tasks.caching import cached, policy
from tasks.download_failures import (
    DownloadError,
    RedirectRefused,
    advice,
    describe_failure,
)
from tasks.layout import StorageLayout

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
MD5_SUFFIX = ".md5"  # beside the archive: its md5 when downloaded
_CONNECT_TIMEOUT_S = 30
_READ_TIMEOUT_S = 60


class ChecksumError(PipelineError, ValueError):
    """The downloaded archive does not have the expected md5."""


@dataclass(frozen=True)
class Archive:
    """A downloaded archive on storage."""

    uri: str
    md5: str
    verified: bool


@dataclass(frozen=True)
class Retry:
    """How often to try a download, and the first wait between tries (doubled each time)."""

    tries: int = 3
    backoff_s: float = 1.0


def expected_md5(url: str, md5: str | None) -> str | None:
    """``md5`` if given; else the official checksum for the official URL, None for others."""
    return md5 or (OFFICIAL_MD5 if url == OFFICIAL_URL else None)


def download_archive(
    url: str, layout: StorageLayout, md5: str | None, retry: Retry = Retry()
) -> Archive:
    """Copy the archive at ``url`` to the layout's ``raw/`` folder and check its md5.

    Skips the copy when a file with the expected md5 is already there. Without ``md5`` the
    archive is copied and reported as unverified (it is checked by structure later).

    Raises:
        PermissionError: Nothing can be written under the storage path.
        DownloadError: The network failed on every try, or the server refused the file.
        ChecksumError: The md5 differs; nothing is left behind.
    """
    layout.check_writable()
    target = layout.raw_archive(url)
    target_fs, target_path = fsspec.core.url_to_fs(target)
    if md5 is not None and target_fs.exists(target_path) and _md5_of(target) == md5:
        logger.info("Archive %s already downloaded and verified; skipping", target)
        return Archive(target, md5, verified=True)
    partial = f"{target_path}.partial-{uuid.uuid4().hex[:8]}"
    target_fs.makedirs(posixpath.dirname(target_path), exist_ok=True)
    try:
        actual = _copy_with_retries(url, target_fs, partial, retry)
        if md5 is not None and actual != md5:
            raise ChecksumError(
                f"{url} has md5 {actual}, expected {md5}; the download is corrupt or the URL "
                "points at another file: check data_url, or pass the right data_md5."
            )
        target_fs.mv(partial, target_path)
        target_fs.pipe_file(f"{target_path}{MD5_SUFFIX}", actual.encode())
    finally:
        if target_fs.exists(partial):
            target_fs.rm(partial)
    if md5 is None:
        logger.warning("No checksum given for %s (md5 %s): unverified", url, actual)
    return Archive(target, actual, verified=md5 is not None)


def _copy_with_retries(
    url: str, target_fs: fsspec.AbstractFileSystem, target_path: str, retry: Retry
) -> str:
    for attempt in range(1, retry.tries + 1):
        try:
            return _copy(url, target_fs, target_path)
        except Exception as exc:
            cause, transient = describe_failure(exc)
            if not transient or attempt == retry.tries:
                raise DownloadError(
                    url, cause, transient, attempt, advice(cause, transient)
                ) from exc
            wait_s = retry.backoff_s * 2 ** (attempt - 1)
            logger.warning(
                "Download of %s failed (%s); try %d of %d in %g s",
                url,
                cause,
                attempt + 1,
                retry.tries,
                wait_s,
            )
            time.sleep(wait_s)
    raise AssertionError("unreachable: the last try returns or raises")


def _copy(url: str, target_fs: fsspec.AbstractFileSystem, target_path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with fsspec.open(url, "rb", **_read_options(url)) as source:
        _refuse_a_redirect(url, source)
        size = getattr(source, "size", None)
        with target_fs.open(target_path, "wb") as target:
            copied, next_log = 0, 0.1
            for chunk in iter(lambda: source.read(_CHUNK), b""):
                target.write(chunk)
                digest.update(chunk)
                copied += len(chunk)
                if size and copied / size >= next_log:
                    logger.info("Downloaded %d%% of %s", 100 * copied // size, url)
                    next_log += 0.1
    return digest.hexdigest()


def _md5_of(uri: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with fsspec.open(uri, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_options(url: str) -> dict[str, Any]:
    """fsspec options: HTTP as a stream (no Range requests) with connect and read timeouts."""
    if urlparse(url).scheme not in ("http", "https"):
        return {}
    import aiohttp

    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=_READ_TIMEOUT_S
    )
    return {"block_size": 0, "allow_redirects": False, "client_kwargs": {"timeout": timeout}}


def _refuse_a_redirect(url: str, source: Any) -> None:
    reply = getattr(source, "r", None)  # fsspec's HTTP stream: its aiohttp response
    status = getattr(reply, "status", 200)
    if isinstance(status, int) and 300 <= status < 400:
        location = reply.headers.get("Location", "")  # type: ignore[union-attr]
        raise RedirectRefused(
            f"the server redirected to {location!r} (HTTP {status}), and downloads follow no "
            "redirect the run policy has not checked"
        )


def archive_is_intact(url: str, layout: StorageLayout, md5: str | None) -> bool:
    """Whether the archive from ``url`` is on storage with the expected md5 (without one, the
    md5 it had when it was downloaded)."""
    target = layout.raw_archive(url)
    fs, path = fsspec.core.url_to_fs(target)
    if not fs.exists(path):
        return False
    if md5 is None:
        try:
            md5 = fs.cat_file(f"{path}{MD5_SUFFIX}").decode().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return False
    return _md5_of(target) == md5


download_task = task(name="download")(download_archive)


def fetch_archive(url: str, layout: StorageLayout, md5: str | None) -> Archive:
    """The download step, cached by Prefect under the storage path (``tasks.caching``): a run
    on the same URL and md5 reuses the archive if it is intact."""
    layout.check_writable()  # a clear PermissionError before storage is read (bad credentials)
    intact = archive_is_intact(url, layout, md5)
    return cached(download_task, layout, policy("retry"), intact=intact)(url, layout, md5)
