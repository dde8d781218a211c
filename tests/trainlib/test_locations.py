"""Where a path or URL points (``trainlib._locations``), on fsspec's own filesystems: the
protocol is stripped by the filesystem it is given with, and inferred when none is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from trainlib._locations import locate


@pytest.mark.parametrize(
    ("path", "filesystem", "expected"),
    [
        ("memory://bucket/run", MemoryFileSystem(), "/bucket/run"),
        ("bucket/run", MemoryFileSystem(), "/bucket/run"),
        ("file:///tmp/run", LocalFileSystem(), "/tmp/run"),
        ("/tmp/run", LocalFileSystem(), "/tmp/run"),
    ],
)
def test_a_given_filesystem_strips_its_own_protocol(
    path: str, filesystem: object, expected: str
) -> None:
    found, where = locate(path, filesystem)  # type: ignore[arg-type]
    assert found is filesystem and where == expected


def test_a_path_without_a_filesystem_gets_the_one_its_protocol_names(tmp_path: Path) -> None:
    assert isinstance(locate("memory://bucket/run")[0], MemoryFileSystem)
    found, where = locate(tmp_path / "run")
    assert isinstance(found, LocalFileSystem) and where == str(tmp_path / "run")
    assert locate("~/run")[1] == os.path.expanduser("~/run")
