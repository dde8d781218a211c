"""Safe extraction of a CIFAR-10 archive: no links, no path escapes, no oversized members."""

from __future__ import annotations

import os
import shutil
import tarfile
import zlib
from typing import Any

import fsspec

from cifar.errors import NotCifarArchiveError, UnsafeArchiveError
from cifar.format import ARCHIVE_DIR, META, TEST_BATCH, TRAIN_BATCHES

MAX_MEMBER_BYTES = 200 * 1024 * 1024  # a real CIFAR-10 batch is 30 MB

# tarfile's "data" filter as well, where Python has it (3.11.4+; Debian 12's 3.11.2 has not):
# the members are checked above either way, and only CIFAR's batch files are extracted.
_DATA_FILTER: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def extract_archive(archive_uri: str, target_dir: str) -> str:
    """Extract the CIFAR batches into ``target_dir``; return the batches directory.

    One streaming pass over the archive: every member is checked before it is written, and on
    any error what was extracted is removed again.

    Raises:
        UnsafeArchiveError: A member is a link, not a plain file or directory, has an absolute
            path or ``..``, or is larger than ``MAX_MEMBER_BYTES``.
        NotCifarArchiveError: The file is truncated, not a tar.gz, or lacks CIFAR's batches.
    """
    wanted = {f"{ARCHIVE_DIR}/{name}" for name in (*TRAIN_BATCHES, TEST_BATCH, META)}
    created = not os.path.exists(target_dir)
    found: set[str] = set()
    try:
        with fsspec.open(archive_uri, "rb") as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
            for member in tar:
                _check_member(member)
                if member.name in wanted:
                    tar.extract(member, target_dir, **_DATA_FILTER)
                    found.add(member.name)
        if missing := wanted - found:
            raise NotCifarArchiveError(
                f"{archive_uri} is not a CIFAR-10 python archive: it lacks "
                f"{', '.join(sorted(missing))}. Point data_url at cifar-10-python.tar.gz "
                "(the python version of CIFAR-10)."
            )
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        _remove(target_dir, created)
        raise NotCifarArchiveError(
            f"{archive_uri} cannot be read as a tar.gz archive ({exc}); it may be truncated or "
            "not an archive: delete it and download again, or check data_url."
        ) from exc
    except BaseException:
        _remove(target_dir, created)
        raise
    return os.path.join(target_dir, ARCHIVE_DIR)


def _remove(target_dir: str, created: bool) -> None:
    """Remove what an extraction left: the whole target if it made it, else the batches."""
    shutil.rmtree(target_dir if created else os.path.join(target_dir, ARCHIVE_DIR), True)


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
