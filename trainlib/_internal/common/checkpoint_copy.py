"""A committed checkpoint copied from one run into another (PBT: a trial takes its donor's
latest), checked file by file against the source's commit marker, and committed in the
target in place of its own checkpoint of that index (deleted first, marker first, so a
cut-off copy leaves no checkpoint of that index)."""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

from trainlib._internal.common.commit_marker import (
    COMMIT_MARKER,
    CommittedCheckpoint,
    describe_file,
)
from trainlib._internal.common.storage import RunStorage
from trainlib._retries import call_storage
from trainlib.errors import CheckpointError


def adopt(target: RunStorage, source: RunStorage, index: int) -> CommittedCheckpoint:
    """Copy ``source``'s latest committed checkpoint into ``target`` as checkpoint ``index``
    (in place of the target's own of that index) and commit it, with its metrics.

    A source checkpoint deleted or rewritten while it is read (its run goes on) is read again,
    from the latest then.

    Raises:
        CheckpointError: ``source`` has no committed checkpoint, or none could be read whole.
    """
    problem: str | None = "it has no committed checkpoint"
    for _ in range(3):
        committed = source.list_committed()
        if not committed:
            break
        latest = committed[-1]
        with tempfile.TemporaryDirectory(prefix="trainlib-adopt-") as local:
            problem = download(source, latest, local)
            if problem is None:
                return _replace(target, index, local, latest.metrics)
    raise CheckpointError(
        f"The checkpoint of {source.url(source.run_dir)} could not be copied to "
        f"{target.url(target.run_dir)}: {problem}."
    )


def download(storage: RunStorage, committed: CommittedCheckpoint, local_dir: str) -> str | None:
    """Copy a committed checkpoint's files into ``local_dir``; what is wrong with them
    (missing, not matching the marker), or None."""
    root = committed.checkpoint.path.rstrip("/")
    for rel, expected in committed.files.items():
        target = os.path.join(local_dir, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            call_storage(
                "download the checkpoint file",
                storage.url(f"{root}/{rel}"),
                functools.partial(storage.filesystem.get_file, f"{root}/{rel}", target),
                (FileNotFoundError,),
            )
        except FileNotFoundError:
            return f"{rel} is missing"
        if describe_file(target) != expected:
            return f"{rel} does not match its sha256 in {COMMIT_MARKER}"
    return None


def _replace(
    storage: RunStorage, index: int, local_dir: str, metrics: dict[str, Any]
) -> CommittedCheckpoint:
    """Checkpoint ``index`` of ``storage`` becomes the files of ``local_dir``."""
    for committed in storage.list_committed():
        if committed.index == index:
            storage.delete(committed.checkpoint)
    target = storage.checkpoint_dir(index)
    if storage.filesystem.exists(target):
        call_storage(
            "clear the checkpoint directory",
            storage.url(target),
            functools.partial(storage.filesystem.rm, target, recursive=True),
        )
    files = storage.upload_directory(local_dir, index)
    return storage.commit(index, files, metrics)
