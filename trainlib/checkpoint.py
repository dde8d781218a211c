"""Checkpoint: a directory on some fsspec filesystem."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from trainlib._locations import locate
from trainlib._retries import call_storage

METADATA_FILE = ".metadata.json"  # Ray's name for a checkpoint's metadata


class Checkpoint:
    """A directory of files on a local or remote filesystem (a ``(path, filesystem)`` value).

    Args:
        path: Directory path, or a URL such as ``s3://bucket/run/checkpoint_000003``.
        filesystem: The fsspec filesystem holding ``path``; inferred from ``path`` if omitted.

    Example:
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
        ...     trainlib.report(metrics, checkpoint=Checkpoint.from_directory(tmp))
    """

    def __init__(self, path: str | os.PathLike[str], filesystem: AbstractFileSystem | None = None):
        if filesystem is None:
            filesystem, path = locate(path)
        self.path: str = str(path)
        self.filesystem: AbstractFileSystem = filesystem

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint for a local directory."""
        return cls(os.path.abspath(os.path.expanduser(os.fspath(path))), LocalFileSystem())

    @property
    def is_local(self) -> bool:
        """True when the files are on this machine's filesystem."""
        return isinstance(self.filesystem, LocalFileSystem)

    def files(self) -> list[str]:
        """Paths of all files, relative to the checkpoint directory, sorted."""
        root = self.path.rstrip("/")
        found = call_storage("list the checkpoint", self._url(), lambda: self.filesystem.find(root))
        return sorted(os.path.relpath(p, root) for p in found)

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the files into a local directory (a new temporary one if ``path`` is None).

        Returns:
            The local directory path.
        """
        target = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        os.makedirs(target, exist_ok=True)
        if self.is_local:
            shutil.copytree(self.path, target, dirs_exist_ok=True)
            return target
        relpaths = self.files()
        for rel in relpaths:
            os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
        root = self.path.rstrip("/")
        call_storage(
            "download the checkpoint",
            self._url(),
            lambda: self.filesystem.get(
                [f"{root}/{r}" for r in relpaths], [os.path.join(target, r) for r in relpaths]
            ),
        )
        return target

    def get_metadata(self) -> dict[str, Any]:
        """The checkpoint's metadata (``{}`` if none was set), as Ray keeps it: the JSON file
        ``.metadata.json`` among its files."""
        path = f"{self.path.rstrip('/')}/{METADATA_FILE}"

        def read() -> dict[str, Any]:
            if not self.filesystem.exists(path):
                return {}
            with self.filesystem.open(path, "r") as f:
                found: dict[str, Any] = json.load(f)
            return found

        return call_storage("read the checkpoint's metadata", self._url(), read)

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the checkpoint's metadata (JSON-serializable values).

        Raises:
            TypeError: A value JSON cannot hold.
        """
        text = json.dumps(metadata)  # before anything is written
        path = f"{self.path.rstrip('/')}/{METADATA_FILE}"

        def write() -> None:
            with self.filesystem.open(path, "w") as f:
                f.write(text)

        call_storage("write the checkpoint's metadata", self._url(), write)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the checkpoint's metadata."""
        self.set_metadata({**self.get_metadata(), **metadata})

    def _url(self) -> str:
        return str(self.filesystem.unstrip_protocol(self.path))

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """Yield a local directory with the files; a temporary copy is removed afterwards."""
        if self.is_local:
            yield self.path
            return
        target = self.to_directory()
        try:
            yield target
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def __fspath__(self) -> str:
        raise TypeError(
            "A Checkpoint is not a path; use `with checkpoint.as_directory() as path:` "
            "or checkpoint.to_directory()."
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Checkpoint)
            and self.path == other.path
            and self.filesystem.protocol == other.filesystem.protocol
        )

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        protocol = self.filesystem.protocol
        scheme = protocol[0] if isinstance(protocol, tuple) else protocol
        return f"Checkpoint({scheme}://{self.path})"
