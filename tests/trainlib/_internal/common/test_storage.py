from __future__ import annotations

from pathlib import Path

import pytest

from trainlib import Checkpoint, CheckpointError
from trainlib._internal.common.checkpoint_copy import adopt
from trainlib._internal.common.commit_marker import COMMIT_MARKER
from trainlib._internal.common.storage import UPLOADING_MARKER, RunStorage


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


def test_storage_named_checkpoint_is_listed_once_committed(
    storage: RunStorage, tmp_path: Path
) -> None:
    files = storage.upload(_checkpoint(tmp_path, b"full"), 4, "full_model")
    directory = Path(storage.run_dir, "full_model")
    assert sorted(p.name for p in directory.iterdir()) == [UPLOADING_MARKER, "model.pt"]
    assert storage.list_committed() == []
    storage.commit(4, files, {"epoch": 3}, "full_model")
    [listed] = storage.list_committed()
    assert (listed.index, listed.checkpoint.path) == (4, str(directory))
    assert listed.checkpoint.files() == [COMMIT_MARKER, "model.pt"]


def test_storage_remove_uncommitted_spares_directories_not_its_own(
    storage: RunStorage, tmp_path: Path
) -> None:
    storage.upload(_checkpoint(tmp_path, b"cut"), 2, "full_model")  # never committed
    Path(storage.run_dir, "tensorboard").mkdir()  # the user's own folder in the run folder
    assert storage.remove_uncommitted() == [f"{storage.run_dir}/full_model"]
    assert sorted(p.name for p in Path(storage.run_dir).iterdir()) == ["tensorboard"]


def test_storage_refused_write_fails_naming_the_path(storage: RunStorage, tmp_path: Path) -> None:
    Path(storage.checkpoint_dir(1)).write_text("a file where the directory goes")
    with pytest.raises(CheckpointError, match=r"Could not upload the checkpoint to .*000001"):
        storage.upload(_checkpoint(tmp_path, b"w1"), 1)


def test_storage_commit_refuses_a_file_the_storage_did_not_keep_whole(
    storage: RunStorage, tmp_path: Path
) -> None:
    files = storage.upload(_checkpoint(tmp_path, b"weights"), 2)
    Path(storage.checkpoint_dir(2), "model.pt").write_bytes(b"w")  # cut off after the upload
    with pytest.raises(CheckpointError, match=r"model.pt .* left 1 bytes instead of 7; the stor"):
        storage.commit(2, files, {})
    assert storage.list_committed() == []


def test_storage_adopt_copies_the_sources_latest_checkpoint_in_place_of_its_own(
    storage: RunStorage, tmp_path: Path
) -> None:
    donor = RunStorage.create(str(tmp_path / "results"), "donor")
    donor.commit(4, donor.upload(_checkpoint(tmp_path, b"d4"), 4), {"loss": 0.4})
    donor.commit(5, donor.upload(_checkpoint(tmp_path, b"d5"), 5), {"loss": 0.3})
    storage.commit(2, storage.upload(_checkpoint(tmp_path, b"own2"), 2), {"loss": 2.0})
    Path(storage.checkpoint_dir(2), "extra.bin").write_bytes(b"own")  # not the donor's
    adopted = adopt(storage, donor, 2)
    assert [(c.index, c.metrics) for c in storage.list_committed()] == [(2, {"loss": 0.3})]
    assert adopted.index == 2 and storage.verify(adopted) is None
    assert sorted(p.name for p in Path(storage.checkpoint_dir(2)).iterdir()) == [
        COMMIT_MARKER,
        "model.pt",
    ]
    assert Path(storage.checkpoint_dir(2), "model.pt").read_bytes() == b"d5"
    assert [c.index for c in donor.list_committed()] == [4, 5]  # the donor's stay


def test_storage_adopt_refuses_a_source_it_cannot_read_whole(
    storage: RunStorage, tmp_path: Path
) -> None:
    donor = RunStorage.create(str(tmp_path / "results"), "donor")
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        adopt(storage, donor, 0)
    donor.commit(0, donor.upload(_checkpoint(tmp_path, b"d0"), 0), {})
    Path(donor.checkpoint_dir(0), "model.pt").write_bytes(b"XX")  # same size, other bytes
    own = storage.commit(0, storage.upload(_checkpoint(tmp_path, b"o0"), 0), {})
    with pytest.raises(CheckpointError, match="does not match its sha256"):
        adopt(storage, donor, 0)
    assert storage.list_committed() == [own]  # its own checkpoint is left as it was
