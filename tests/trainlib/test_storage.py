from __future__ import annotations

from pathlib import Path

import pytest

from trainlib import Checkpoint
from trainlib._internal.storage import COMMIT_MARKER, RunStorage


@pytest.fixture
def storage(tmp_path: Path) -> RunStorage:
    return RunStorage.create(str(tmp_path / "results"), "run")


def _checkpoint(tmp_path: Path, content: bytes) -> Checkpoint:
    directory = tmp_path / f"src-{content.decode()}"
    directory.mkdir()
    (directory / "model.pt").write_bytes(content)
    return Checkpoint.from_directory(directory)


def test_storage_round_trip_of_committed_checkpoint(storage: RunStorage, tmp_path: Path) -> None:
    files = storage.upload(_checkpoint(tmp_path, b"w1"), 3)
    committed = storage.commit(3, files, {"loss": 0.5})
    listed = storage.list_committed()
    assert [(c.index, c.metrics) for c in listed] == [(3, {"loss": 0.5})]
    assert listed[0].checkpoint == committed.checkpoint
    restored = listed[0].checkpoint.to_directory(tmp_path / "restored")
    assert Path(restored, "model.pt").read_bytes() == b"w1"
    assert files["model.pt"].size == 2


def test_storage_never_lists_a_checkpoint_without_marker(
    storage: RunStorage, tmp_path: Path
) -> None:
    storage.commit(0, storage.upload(_checkpoint(tmp_path, b"w0"), 0), {})
    storage.upload(_checkpoint(tmp_path, b"w1"), 1)  # uploaded, never committed
    assert [c.index for c in storage.list_committed()] == [0]


def test_storage_ignores_truncated_marker(storage: RunStorage, tmp_path: Path) -> None:
    storage.commit(0, storage.upload(_checkpoint(tmp_path, b"w0"), 0), {"loss": 1.0})
    marker = Path(storage.checkpoint_dir(0), COMMIT_MARKER)
    marker.write_bytes(marker.read_bytes()[:10])
    assert storage.list_committed() == []


def test_storage_remove_uncommitted_keeps_committed(storage: RunStorage, tmp_path: Path) -> None:
    storage.commit(0, storage.upload(_checkpoint(tmp_path, b"w0"), 0), {})
    storage.upload(_checkpoint(tmp_path, b"w1"), 1)
    removed = storage.remove_uncommitted()
    assert removed == [storage.checkpoint_dir(1)]
    assert sorted(p.name for p in Path(storage.run_dir).iterdir()) == ["checkpoint_000000"]
