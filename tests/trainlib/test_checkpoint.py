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
