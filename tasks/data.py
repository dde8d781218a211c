"""Getting the CIFAR-10 archive: download from any fsspec URL, verify, extract safely."""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import tarfile
import uuid
from dataclasses import dataclass

import fsspec
from prefect import task
from prefect.client.schemas.objects import State

from tasks.cifar import ARCHIVE_DIR, META, TEST_BATCH, TRAIN_BATCHES

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
MAX_MEMBER_BYTES = 200 * 1024 * 1024  # a real CIFAR-10 batch is 30 MB


class ChecksumError(ValueError):
    """The downloaded archive does not have the expected md5."""


class UnsafeArchiveError(ValueError):
    """The archive has a member that could escape the target directory or exhaust the disk."""


@dataclass(frozen=True)
class Archive:
    """A downloaded archive on storage."""

    uri: str
    md5: str
    verified: bool


def download_archive(url: str, storage_path: str, md5: str | None) -> Archive:
    """Copy the archive at ``url`` to ``{storage_path}/raw/`` and check its md5.

    Skips the copy when a file with the expected md5 is already there. Without ``md5`` the
    archive is copied and reported as unverified (it is checked by structure later).

    Raises:
        ChecksumError: The md5 differs; the partial copy is removed.
    """
    target = posixpath.join(storage_path.rstrip("/"), "raw", posixpath.basename(url.rstrip("/")))
    target_fs, target_path = fsspec.core.url_to_fs(target)
    if md5 is not None and target_fs.exists(target_path) and _md5_of(target) == md5:
        logger.info("Archive %s already downloaded and verified; skipping", target)
        return Archive(target, md5, verified=True)
    partial = f"{target_path}.partial-{uuid.uuid4().hex[:8]}"
    target_fs.makedirs(posixpath.dirname(target_path), exist_ok=True)
    try:
        actual = _copy(url, target_fs, partial)
        if md5 is not None and actual != md5:
            raise ChecksumError(
                f"{url} has md5 {actual}, expected {md5}; the download is corrupt or the URL "
                "points at another file: check data_url, or pass the right data_md5."
            )
        target_fs.mv(partial, target_path)
    finally:
        if target_fs.exists(partial):
            target_fs.rm(partial)
    if md5 is None:
        logger.warning("No checksum given for %s (md5 %s): unverified", url, actual)
    return Archive(target, actual, verified=md5 is not None)


def _copy(url: str, target_fs: fsspec.AbstractFileSystem, target_path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with fsspec.open(url, "rb") as source, target_fs.open(target_path, "wb") as target:
        size = getattr(source, "size", None)
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


def extract_archive(archive_uri: str, target_dir: str) -> str:
    """Extract the CIFAR batches into ``target_dir``; return the batches directory.

    Raises:
        UnsafeArchiveError: A member is a link, not a plain file or directory, has an absolute
            path or ``..``, or is larger than ``MAX_MEMBER_BYTES``. Nothing is extracted then.
        tarfile.TarError: The archive is truncated or not a tar.gz; as a ValueError naming it.
    """
    wanted = {f"{ARCHIVE_DIR}/{name}" for name in (*TRAIN_BATCHES, TEST_BATCH, META)}
    try:
        with fsspec.open(archive_uri, "rb") as raw, tarfile.open(fileobj=raw, mode="r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member)
            missing = wanted - {m.name for m in members}
            if missing:
                raise ValueError(
                    f"{archive_uri} is not a CIFAR-10 python archive: missing {sorted(missing)}"
                )
            tar.extractall(
                target_dir, members=[m for m in members if m.name in wanted], filter="data"
            )
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(
            f"{archive_uri} cannot be read as a tar.gz archive ({exc}); it may be truncated: "
            "delete it and download again."
        ) from exc
    return os.path.join(target_dir, ARCHIVE_DIR)


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or ".." in name.split("/"):
        raise UnsafeArchiveError(f"archive member {name!r} escapes the target directory")
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"archive member {name!r} is a link or special file")
    if member.size > MAX_MEMBER_BYTES:
        raise UnsafeArchiveError(
            f"archive member {name!r} has {member.size} bytes, more than {MAX_MEMBER_BYTES}"
        )


def _is_transient(task: object, task_run: object, state: State) -> bool:
    """Retry network trouble, not a wrong checksum or a bad archive."""
    try:
        state.result()
    except (ValueError, FileNotFoundError, PermissionError):
        return False
    except Exception:
        return True
    return False


download_task = task(
    name="download", retries=3, retry_delay_seconds=2, retry_condition_fn=_is_transient
)(download_archive)
