"""Run directory layout on fsspec storage, with atomic checkpoint commits.

Layout of one run::

    {storage_path}/{name}/
        checkpoint_000000/
            model.pt                  files uploaded by the ranks
            .trainlib-commit.json     commit marker, written last by the driver
        checkpoint_000002/ ...
        full_model/                   a report's checkpoint_dir_name
            .trainlib-uploading       until its commit: the directory is a checkpoint's

A checkpoint exists only once its commit marker does. The marker lists every file with its
size and sha256 and the metrics reported with it; a directory without a readable marker (a
write that was cut off) is never listed, loaded or resumed from. Every call goes through
``retries.call_storage``: transient errors are retried, permanent ones fail at once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from fsspec import AbstractFileSystem

from trainlib._internal.common.commit_marker import (
    COMMIT_MARKER,
    CommittedCheckpoint,
    FileEntry,
    Marker,
    describe_file,
)
from trainlib._locations import locate
from trainlib._retries import call_storage
from trainlib.checkpoint import Checkpoint
from trainlib.errors import CheckpointError

logger = logging.getLogger(__name__)

T = TypeVar("T")

UPLOADING_MARKER = ".trainlib-uploading"  # in a named checkpoint directory until its commit
_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d{6,})$")


class RunStorage:
    """The directory of one run on a filesystem; picklable, so ranks get a copy."""

    def __init__(self, filesystem: AbstractFileSystem, run_dir: str) -> None:
        self.filesystem = filesystem
        self.run_dir = run_dir.rstrip("/")

    @classmethod
    def create(
        cls, storage_path: str, name: str, filesystem: AbstractFileSystem | None = None
    ) -> RunStorage:
        """Resolve ``storage_path`` (path or URL) and make the run directory."""
        filesystem, root = locate(storage_path, filesystem)
        storage = cls(filesystem, f"{str(root).rstrip('/')}/{name}")
        storage._call(
            "create the run directory",
            storage.run_dir,
            lambda: filesystem.makedirs(storage.run_dir, exist_ok=True),
        )
        return storage

    def url(self, path: str) -> str:
        """``path`` on this filesystem as a URL (``s3://bucket/run``), for messages."""
        return str(self.filesystem.unstrip_protocol(path))

    def checkpoint_dir(self, index: int, name: str | None = None) -> str:
        """Directory of the checkpoint reported at ``index`` (or under ``name``)."""
        return f"{self.run_dir}/{name or f'checkpoint_{index:06d}'}"

    def is_committed(self, directory: str) -> bool:
        """True when ``directory`` holds a valid commit marker."""
        return self._read_marker(directory) is not None

    def upload(
        self, checkpoint: Checkpoint, index: int, name: str | None = None
    ) -> dict[str, FileEntry]:
        """Copy a checkpoint's files into the directory for ``index`` (not yet committed).

        Returns:
            The uploaded files, relative path -> size and sha256.
        """
        with checkpoint.as_directory() as local_dir:
            return self.upload_directory(local_dir, index, name)

    def upload_directory(
        self, local_dir: str, index: int, name: str | None = None
    ) -> dict[str, FileEntry]:
        """Upload the files of a local directory for ``index``; ``commit`` checks them there.

        (Not here: other ranks may be writing a file of the same name at this moment.)
        """
        relpaths = Checkpoint.from_directory(local_dir).files()
        entries = {rel: describe_file(os.path.join(local_dir, rel)) for rel in relpaths}
        target = self.checkpoint_dir(index, name)
        self._call(
            "upload the checkpoint to", target, lambda: self._put(local_dir, relpaths, target)
        )
        return entries

    def _put(self, local_dir: str, relpaths: list[str], target: str) -> None:
        self.filesystem.makedirs(target, exist_ok=True)
        if not _CHECKPOINT_DIR.search(target):  # a named directory: mark it as ours
            self.filesystem.pipe_file(f"{target}/{UPLOADING_MARKER}", b"")
        for rel in {os.path.dirname(r) for r in relpaths if os.path.dirname(r)}:
            self.filesystem.makedirs(f"{target}/{rel}", exist_ok=True)
        if relpaths:
            self.filesystem.put(
                [os.path.join(local_dir, r) for r in relpaths], [f"{target}/{r}" for r in relpaths]
            )

    def _stored_entry(self, path: str) -> FileEntry:
        """Size and sha256 of a stored file, read in chunks (a model need not fit in memory)."""

        def read() -> FileEntry:
            with self.filesystem.open(path, "rb") as stored:
                digest = hashlib.file_digest(stored, "sha256")
                return FileEntry(size=stored.tell(), sha256=digest.hexdigest())

        return self._call("read back", path, read)

    def _check_sizes(self, target: str, entries: dict[str, FileEntry]) -> None:
        """Raise unless every uploaded file is there with its size."""
        self.filesystem.invalidate_cache(target)
        found = self._call(
            "list the uploaded checkpoint at",
            target,
            lambda: self.filesystem.find(target, detail=True),
        )
        sizes = {os.path.relpath(path, target): info.get("size") for path, info in found.items()}
        for rel, entry in entries.items():
            if sizes.get(rel) != entry.size:
                raise CheckpointError(
                    f"The upload of {rel} to {self.url(target)} left {sizes.get(rel)} bytes "
                    f"instead of {entry.size}; the storage did not keep the file."
                )

    def commit(
        self,
        index: int,
        files: dict[str, FileEntry],
        metrics: dict[str, Any],
        name: str | None = None,
        differing: Collection[str] = (),
        validation: dict[str, Any] | None = None,
    ) -> CommittedCheckpoint:
        """Write the commit marker that makes checkpoint ``index`` visible, once every rank's
        upload has ended and each file is there with its size (a cut-off upload is not).

        ``differing``: files that ranks uploaded with different contents; the marker records
        the copy the storage kept (read back), whichever rank wrote it last. ``validation``: the
        arguments of the validation the report asked for (recorded until it ends, so that a
        later run of the same name runs it if this one stops first).
        """
        directory = self.checkpoint_dir(index, name)
        files = {**files, **{rel: self._stored_entry(f"{directory}/{rel}") for rel in differing}}
        self._check_sizes(directory, files)
        marker = Marker(index, metrics, files, validation=validation)
        contents = marker.encode()
        path = f"{directory}/{COMMIT_MARKER}"
        self._call("commit the checkpoint", path, lambda: self.filesystem.pipe_file(path, contents))
        if name is not None:
            uploading = f"{directory}/{UPLOADING_MARKER}"
            self._call(
                "clean up",
                uploading,
                lambda: self.filesystem.rm_file(uploading),
                (FileNotFoundError,),
            )
        return marker.committed(Checkpoint(directory, self.filesystem))

    def record_validation(
        self, committed: CommittedCheckpoint, metrics: dict[str, Any] | None
    ) -> CommittedCheckpoint:
        """Rewrite a committed checkpoint's marker once its validation ended: with its
        validated ``metrics``, or (None: it failed) as it was, no longer waiting. The new
        marker is written beside the old one and moved over it, so a cut-off write never
        leaves the checkpoint without a whole marker."""
        validated = metrics is not None
        metrics = committed.metrics if metrics is None else metrics
        marker = Marker(committed.index, metrics, committed.files, validated=validated)
        path = f"{committed.checkpoint.path}/{COMMIT_MARKER}"
        staged = f"{path}.new"
        contents = marker.encode()
        self._call(
            "record the validation", staged, lambda: self.filesystem.pipe_file(staged, contents)
        )
        self._call("record the validation", path, lambda: self.filesystem.mv(staged, path))
        return marker.committed(committed.checkpoint)

    def list_committed(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints, oldest first; directories without a valid marker are skipped."""
        self.filesystem.invalidate_cache(self.run_dir)
        found = []
        for directory in self._directories():
            marker = self._read_marker(directory)
            if marker is not None:
                found.append(marker.committed(Checkpoint(directory, self.filesystem)))
        return sorted(found, key=lambda c: c.index)

    def remove_uncommitted(self) -> list[str]:
        """Delete checkpoint directories without a valid marker (left by a cut-off write)."""
        self.filesystem.invalidate_cache(self.run_dir)
        removed = [
            d
            for d in self._directories()
            if self._is_checkpoint_dir(d) and self._read_marker(d) is None
        ]
        for directory in removed:
            logger.warning("Removing incomplete checkpoint %s", directory)
            self._call(
                "remove the incomplete checkpoint",
                directory,
                functools.partial(self.filesystem.rm, directory, recursive=True),
            )
        return removed

    def verify(self, committed: CommittedCheckpoint) -> str | None:
        """What is wrong with a committed checkpoint's files (size, sha256), or None."""
        root = committed.checkpoint.path.rstrip("/")
        for rel, expected in committed.files.items():
            path = f"{root}/{rel}"
            try:
                data = self._call(
                    "read the checkpoint file",
                    path,
                    functools.partial(self.filesystem.cat_file, path),
                    (FileNotFoundError,),
                )
            except FileNotFoundError:
                return f"{rel} is missing"
            if len(data) != expected.size or hashlib.sha256(data).hexdigest() != expected.sha256:
                return f"{rel} does not match its sha256 in {COMMIT_MARKER}"
        return None

    def delete(self, checkpoint: Checkpoint) -> None:
        """Delete a committed checkpoint: the marker first, so it is never seen half-deleted."""
        marker = f"{checkpoint.path}/{COMMIT_MARKER}"
        self._call("delete the checkpoint", marker, lambda: self.filesystem.rm_file(marker))
        self._call(
            "delete the checkpoint",
            checkpoint.path,
            lambda: self.filesystem.rm(checkpoint.path, recursive=True),
        )

    def _call(
        self,
        operation: str,
        path: str,
        call: Callable[[], T],
        expected: tuple[type[BaseException], ...] = (),
    ) -> T:
        return call_storage(operation, self.url(path), call, expected)

    def _is_checkpoint_dir(self, directory: str) -> bool:
        """A directory of ours: named ``checkpoint_NNNNNN``, or marked while uploading."""
        if _CHECKPOINT_DIR.search(directory):
            return True
        path = f"{directory}/{UPLOADING_MARKER}"
        return bool(self._call("look for", path, lambda: self.filesystem.exists(path)))

    def _directories(self) -> list[str]:
        """Every directory of the run: checkpoints have any name (``checkpoint_dir_name``)."""
        try:
            entries = self._call(
                "list the run directory",
                self.run_dir,
                lambda: self.filesystem.ls(self.run_dir, detail=True),
                (FileNotFoundError,),
            )
        except FileNotFoundError:
            return []
        return [e["name"].rstrip("/") for e in entries if e["type"] == "directory"]

    def _read_marker(self, directory: str) -> Marker | None:
        path = f"{directory}/{COMMIT_MARKER}"
        try:
            raw = self._call(
                "read the commit marker",
                path,
                lambda: self.filesystem.cat_file(path),
                (FileNotFoundError,),
            )
        except FileNotFoundError:
            return None
        return Marker.decode(raw)
