"""Run directory layout on fsspec storage, with atomic checkpoint commits.

Layout of one run::

    {storage_path}/{name}/
        checkpoint_000000/
            model.pt                  files uploaded by the ranks
            .trainlib-commit.json     commit marker, written last by the driver
        checkpoint_000002/ ...

A checkpoint exists only once its commit marker does. The marker lists every file with its
size and sha256 and the metrics reported with it; a directory without a readable marker (a
write that was cut off) is never listed, loaded or resumed from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from trainlib.checkpoint import Checkpoint

logger = logging.getLogger(__name__)

COMMIT_MARKER = ".trainlib-commit.json"
_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d{6,})$")


@dataclass(frozen=True)
class FileEntry:
    """One checkpoint file as recorded in the commit marker."""

    size: int
    sha256: str


@dataclass(frozen=True)
class CommittedCheckpoint:
    """A committed checkpoint with the report index, metrics and files it was committed with."""

    index: int
    checkpoint: Checkpoint
    metrics: dict[str, Any]
    files: dict[str, FileEntry]


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
        if filesystem is None:
            filesystem, root = fsspec.core.url_to_fs(os.path.expanduser(storage_path))
        else:
            root = filesystem._strip_protocol(storage_path)
        storage = cls(filesystem, f"{str(root).rstrip('/')}/{name}")
        filesystem.makedirs(storage.run_dir, exist_ok=True)
        return storage

    def checkpoint_dir(self, index: int) -> str:
        """Directory of the checkpoint reported at ``index``."""
        return f"{self.run_dir}/checkpoint_{index:06d}"

    def upload(self, checkpoint: Checkpoint, index: int) -> dict[str, FileEntry]:
        """Copy a checkpoint's files into the directory for ``index`` (not yet committed).

        Returns:
            The uploaded files, relative path -> size and sha256.
        """
        with checkpoint.as_directory() as local_dir:
            relpaths = Checkpoint.from_directory(local_dir).files()
            entries = {rel: _describe(os.path.join(local_dir, rel)) for rel in relpaths}
            target = self.checkpoint_dir(index)
            self.filesystem.makedirs(target, exist_ok=True)
            for rel in {os.path.dirname(r) for r in relpaths if os.path.dirname(r)}:
                self.filesystem.makedirs(f"{target}/{rel}", exist_ok=True)
            if relpaths:
                self.filesystem.put(
                    [os.path.join(local_dir, r) for r in relpaths],
                    [f"{target}/{r}" for r in relpaths],
                )
        return entries

    def commit(
        self, index: int, files: dict[str, FileEntry], metrics: dict[str, Any]
    ) -> CommittedCheckpoint:
        """Write the commit marker that makes checkpoint ``index`` visible."""
        marker = {
            "index": index,
            "metrics": metrics,
            "files": {rel: {"size": e.size, "sha256": e.sha256} for rel, e in files.items()},
        }
        directory = self.checkpoint_dir(index)
        self.filesystem.pipe_file(f"{directory}/{COMMIT_MARKER}", _to_json(marker))
        return CommittedCheckpoint(index, Checkpoint(directory, self.filesystem), metrics, files)

    def list_committed(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints, oldest first; directories without a valid marker are skipped."""
        self.filesystem.invalidate_cache(self.run_dir)
        found = []
        for directory in self._checkpoint_dirs():
            marker = self._read_marker(directory)
            if marker is not None:
                checkpoint = Checkpoint(directory, self.filesystem)
                files = {rel: FileEntry(**entry) for rel, entry in marker["files"].items()}
                found.append(
                    CommittedCheckpoint(marker["index"], checkpoint, marker["metrics"], files)
                )
        return sorted(found, key=lambda c: c.index)

    def remove_uncommitted(self) -> list[str]:
        """Delete checkpoint directories without a valid marker (left by a cut-off write)."""
        self.filesystem.invalidate_cache(self.run_dir)
        removed = [d for d in self._checkpoint_dirs() if self._read_marker(d) is None]
        for directory in removed:
            logger.warning("Removing incomplete checkpoint %s", directory)
            self.filesystem.rm(directory, recursive=True)
        return removed

    def verify(self, committed: CommittedCheckpoint) -> str | None:
        """What is wrong with a committed checkpoint's files (size, sha256), or None."""
        root = committed.checkpoint.path.rstrip("/")
        for rel, expected in committed.files.items():
            try:
                data = self.filesystem.cat_file(f"{root}/{rel}")
            except FileNotFoundError:
                return f"{rel} is missing"
            if len(data) != expected.size or hashlib.sha256(data).hexdigest() != expected.sha256:
                return f"{rel} does not match its sha256 in {COMMIT_MARKER}"
        return None

    def delete(self, checkpoint: Checkpoint) -> None:
        """Delete a committed checkpoint: the marker first, so it is never seen half-deleted."""
        self.filesystem.rm_file(f"{checkpoint.path}/{COMMIT_MARKER}")
        self.filesystem.rm(checkpoint.path, recursive=True)

    def _checkpoint_dirs(self) -> list[str]:
        if not self.filesystem.exists(self.run_dir):
            return []
        entries = self.filesystem.ls(self.run_dir, detail=True)
        return [
            e["name"].rstrip("/")
            for e in entries
            if e["type"] == "directory" and _CHECKPOINT_DIR.search(e["name"].rstrip("/"))
        ]

    def _read_marker(self, directory: str) -> dict[str, Any] | None:
        try:
            marker = json.loads(self.filesystem.cat_file(f"{directory}/{COMMIT_MARKER}"))
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(marker, dict) or not {"index", "metrics", "files"} <= marker.keys():
            return None
        return marker


def _describe(path: str) -> FileEntry:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return FileEntry(size=os.path.getsize(path), sha256=digest.hexdigest())


def _to_json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=_jsonable).encode()


def _jsonable(value: Any) -> Any:
    """Numbers from numpy or torch become plain Python numbers; anything else a string."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)
