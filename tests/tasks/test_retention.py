"""What runs leave in storage: a published run keeps its registered checkpoint only; an ended
run keeps its committed checkpoints until the retention, never an uncommitted one."""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import trainlib
from tasks.retention import prune_published, retention_days, sweep_runs
from trainlib.torch import TorchTrainer


def _train_func(config: dict[str, Any]) -> None:
    for epoch in range(3):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "weights.txt").write_text(str(epoch))
            trainlib.report(
                {"epoch": epoch}, checkpoint=trainlib.Checkpoint.from_directory(directory)
            )


def _run(runs: Path, name: str) -> Path:
    """A finished run of 3 committed checkpoints (local mode), and a directory left by a cut-off
    checkpoint write."""
    TorchTrainer(
        _train_func,
        scaling_config=trainlib.ScalingConfig(num_workers=0),
        run_config=trainlib.RunConfig(name=name, storage_path=str(runs)),
    ).fit()
    (runs / name / "checkpoint_000003").mkdir()
    (runs / name / "checkpoint_000003" / "weights.txt").write_text("cut off")
    return runs / name


def _contents(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir()) if run.exists() else []


def test_retention_a_published_run_keeps_its_registered_checkpoint_only(tmp_path: Path) -> None:
    run = _run(tmp_path, "published")
    prune_published(str(run), str(run / "checkpoint_000001"))
    assert _contents(run) == ["checkpoint_000001"]


def test_retention_sweeps_only_ended_runs_of_the_flow(tmp_path: Path) -> None:
    ended_id, running_id = str(uuid.uuid4()), str(uuid.uuid4())
    ended, running = (
        _run(tmp_path, f"train-cifar-{ended_id}"),
        _run(tmp_path, f"train-cifar-{running_id}"),
    )
    users = _run(tmp_path, "my-experiment")
    swept = sweep_runs(str(tmp_path), lambda flow_run: flow_run == ended_id, retention_s=3600)
    assert _contents(ended) == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert swept.uncommitted == (str(ended / "checkpoint_000003"),)
    assert "checkpoint_000003" in _contents(running)  # it may still be writing it
    assert "checkpoint_000003" in _contents(users)  # a user's own run name: theirs
    assert swept.expired == ()


def test_retention_an_ended_run_is_deleted_after_the_retention(tmp_path: Path) -> None:
    run = _run(tmp_path, f"train-cifar-{uuid.uuid4()}")
    later = time.time() + 2 * 3600
    swept = sweep_runs(str(tmp_path), lambda flow_run: True, retention_s=3600, now=later)
    assert swept.expired == (str(run),)
    assert not run.exists()


def test_retention_days_come_from_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CIFAR_RETENTION_DAYS", raising=False)
    assert retention_days() == 90
    monkeypatch.setenv("CIFAR_RETENTION_DAYS", "0")
    with pytest.raises(ValueError, match="CIFAR_RETENTION_DAYS='0' must be a positive"):
        retention_days()
