from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest

from trainlib import Checkpoint


def _write_tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "model.pt").write_bytes(b"weights")
    (root / "sub" / "opt.pt").write_bytes(b"optimizer")


def test_checkpoint_to_directory_copies_every_file(tmp_path: Path) -> None:
    _write_tree(tmp_path / "src")
    target = Checkpoint.from_directory(tmp_path / "src").to_directory(tmp_path / "dst")
    assert Path(target, "model.pt").read_bytes() == b"weights"
    assert Path(target, "sub", "opt.pt").read_bytes() == b"optimizer"


def test_checkpoint_as_directory_of_remote_files_is_temporary(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe({"/ckpt/model.pt": b"weights", "/ckpt/sub/opt.pt": b"optimizer"})
    checkpoint = Checkpoint("/ckpt", fs)
    with checkpoint.as_directory() as local:
        assert Path(local, "sub", "opt.pt").read_bytes() == b"optimizer"
    assert not os.path.exists(local)
    assert checkpoint.files() == ["model.pt", "sub/opt.pt"]


def test_checkpoint_url_infers_filesystem() -> None:
    checkpoint = Checkpoint("memory://bucket/run/checkpoint_000001")
    assert "memory" in checkpoint.filesystem.protocol
    assert not checkpoint.is_local


def test_checkpoint_used_as_path_names_the_right_call(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="as_directory"):
        open(Checkpoint.from_directory(tmp_path))  # noqa: SIM115


@pytest.mark.parametrize("where", ["local", "memory"])
def test_checkpoint_metadata_as_ray_keeps_it(tmp_path: Path, where: str) -> None:
    """get/set/update_metadata: JSON in the checkpoint's .metadata.json, travelling with its
    files; a value JSON cannot hold is refused before anything is written."""
    if where == "local":
        _write_tree(tmp_path / "src")
        checkpoint = Checkpoint.from_directory(tmp_path / "src")
    else:
        fs = fsspec.filesystem("memory")
        fs.pipe(f"/meta-{os.getpid()}/model.pt", b"weights")
        checkpoint = Checkpoint(f"memory:///meta-{os.getpid()}")
    assert checkpoint.get_metadata() == {}
    checkpoint.set_metadata({"epoch": 3, "note": "warm"})
    checkpoint.update_metadata({"epoch": 4, "loss": 0.25})
    assert checkpoint.get_metadata() == {"epoch": 4, "note": "warm", "loss": 0.25}
    with pytest.raises(TypeError):
        checkpoint.set_metadata({"bad": object()})
    assert checkpoint.get_metadata() == {"epoch": 4, "note": "warm", "loss": 0.25}
    copied = Checkpoint.from_directory(checkpoint.to_directory(tmp_path / "copy"))
    assert copied.get_metadata()["loss"] == 0.25
    assert ".metadata.json" in checkpoint.files()
