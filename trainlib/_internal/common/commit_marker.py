"""The commit marker of a checkpoint: the file whose presence makes a checkpoint exist, and
the committed checkpoint it describes.

It lists every file of the checkpoint with its size and sha256, and the report's index and
metrics, as JSON; a marker that cannot be read back whole is no marker (a cut-off write).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from trainlib.checkpoint import Checkpoint

COMMIT_MARKER = ".trainlib-commit.json"


@dataclass(frozen=True)
class FileEntry:
    """One checkpoint file as recorded in the commit marker."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Marker:
    """What a commit marker records."""

    index: int
    metrics: dict[str, Any]
    files: dict[str, FileEntry]
    validated: bool = False  # the metrics include a validation's (``ValidationConfig``)
    validation: dict[str, Any] | None = None  # a validation asked for, not ended: its arguments

    def encode(self) -> bytes:
        """The marker's file contents."""
        files = {rel: {"size": e.size, "sha256": e.sha256} for rel, e in self.files.items()}
        value: dict[str, Any] = {"index": self.index, "metrics": self.metrics, "files": files}
        if self.validated:
            value["validated"] = True
        if self.validation is not None:
            value["validation"] = self.validation
        return json.dumps(value, indent=1, sort_keys=True, default=_jsonable).encode()

    def committed(self, checkpoint: Checkpoint) -> CommittedCheckpoint:
        """The checkpoint this marker commits, as the driver holds it."""
        return CommittedCheckpoint(
            self.index, checkpoint, self.metrics, self.files, self.validated, self.validation
        )

    @staticmethod
    def decode(raw: bytes) -> Marker | None:
        """The marker in ``raw``, or None if it is not a whole marker."""
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(value, dict) or not {"index", "metrics", "files"} <= value.keys():
            return None
        files = {rel: FileEntry(**entry) for rel, entry in value["files"].items()}
        validation = value.get("validation")
        return Marker(
            value["index"],
            value["metrics"],
            files,
            value.get("validated") is True,
            validation if isinstance(validation, dict) else None,
        )


@dataclass(frozen=True)
class CommittedCheckpoint:
    """A committed checkpoint with the report index, metrics and files it was committed with
    (``validated``: its metrics include its validation's; ``validation``: the arguments of a
    validation asked for that has not ended)."""

    index: int
    checkpoint: Checkpoint
    metrics: dict[str, Any]
    files: dict[str, FileEntry]
    validated: bool = False
    validation: dict[str, Any] | None = None


def describe_file(path: str) -> FileEntry:
    """The size and sha256 of a local file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return FileEntry(size=os.path.getsize(path), sha256=digest.hexdigest())


def _jsonable(value: Any) -> Any:
    """Numbers from numpy or torch become plain Python numbers; anything else a string."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)
