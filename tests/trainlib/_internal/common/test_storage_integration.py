"""Checkpoint storage on a real S3 endpoint (moto's server over HTTP)."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import s3fs
import torch
from distributed import Client

import trainlib
from tests.conftest import S3_BUCKET
from trainlib import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from trainlib._internal.common.commit_marker import COMMIT_MARKER
from trainlib._internal.common.storage import RunStorage
from trainlib.torch import TorchTrainer


def _source(tmp_path: Path, content: bytes) -> Checkpoint:
    directory = tmp_path / f"src-{uuid.uuid4().hex}"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "model.pt").write_bytes(content)
    return Checkpoint.from_directory(directory)


def test_storage_s3_lists_only_committed_checkpoints(
    s3_filesystem: s3fs.S3FileSystem, tmp_path: Path
) -> None:
    storage = RunStorage.create(f"s3://{S3_BUCKET}/unit-{uuid.uuid4().hex}", "run", s3_filesystem)
    storage.commit(0, storage.upload(_source(tmp_path, b"w0"), 0), {"loss": 1.0})
    storage.upload(_source(tmp_path, b"w1"), 1)  # cut off before its commit
    listed = storage.list_committed()
    assert [(c.index, c.metrics) for c in listed] == [(0, {"loss": 1.0})]
    restored = listed[0].checkpoint.to_directory(tmp_path / "restored")
    assert Path(restored, "sub", "model.pt").read_bytes() == b"w0"
    assert storage.remove_uncommitted() == [storage.checkpoint_dir(1)]


def save_each_epoch(config: dict[str, Any]) -> None:
    rank = trainlib.get_context().get_world_rank()
    for epoch in range(3):
        with tempfile.TemporaryDirectory() as directory:
            torch.save({"epoch": epoch, "rank": rank}, os.path.join(directory, f"rank{rank}.pt"))
            trainlib.report(
                {"epoch": epoch, "score": [1.0, 3.0, 2.0][epoch]},
                checkpoint=Checkpoint.from_directory(directory),
            )


def test_storage_s3_trainer_commits_and_keeps_best(
    dask_client: Client, s3_filesystem: s3fs.S3FileSystem, tmp_path: Path
) -> None:
    root = f"s3://{S3_BUCKET}/fit-{uuid.uuid4().hex}"
    result = TorchTrainer(
        save_each_epoch,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=root,
            storage_filesystem=s3_filesystem,
            checkpoint_config=CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="score"),
        ),
        client=dask_client,
    ).fit()
    assert [m["epoch"] for _, m in result.best_checkpoints] == [1, 2]
    assert result.checkpoint is not None
    assert result.checkpoint.files() == [COMMIT_MARKER, "rank0.pt", "rank1.pt"]
    s3_filesystem.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in s3_filesystem.ls(result.path)) == [
        "checkpoint_000001",
        "checkpoint_000002",
    ]
    with result.checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, "rank1.pt"), weights_only=True)
    assert state == {"epoch": 2, "rank": 1}
