from __future__ import annotations

from pathlib import Path

from trainlib import Checkpoint, CheckpointConfig
from trainlib._internal.common.commit_marker import CommittedCheckpoint
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager


def _commit(
    storage: RunStorage, tmp_path: Path, index: int, metrics: dict[str, float]
) -> CommittedCheckpoint:
    source = tmp_path / f"src{index}"
    source.mkdir()
    (source / "model.pt").write_bytes(b"x")
    files = storage.upload(Checkpoint.from_directory(source), index)
    return storage.commit(index, files, metrics)


def _run(tmp_path: Path, config: CheckpointConfig, scores: list[float]) -> CheckpointManager:
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    manager = CheckpointManager(config, storage)
    for index, score in enumerate(scores):
        manager.register(_commit(storage, tmp_path, index, {"score": score}))
    return manager


def _on_disk(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "results" / "run").iterdir())


def test_manager_keeps_best_by_score_plus_latest(tmp_path: Path) -> None:
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score")
    manager = _run(tmp_path, config, [1.0, 5.0, 3.0, 2.0])
    assert [m["score"] for _, m in manager.kept] == [5.0, 3.0, 2.0]
    assert _on_disk(tmp_path) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]


def test_manager_min_order_keeps_lowest(tmp_path: Path) -> None:
    config = CheckpointConfig(
        num_to_keep=1, checkpoint_score_attribute="score", checkpoint_score_order="min"
    )
    manager = _run(tmp_path, config, [3.0, 1.0, 2.0, 4.0])
    assert [m["score"] for _, m in manager.kept] == [1.0, 4.0]


def test_manager_without_score_keeps_most_recent(tmp_path: Path) -> None:
    manager = _run(tmp_path, CheckpointConfig(num_to_keep=2), [1.0, 2.0, 3.0])
    assert _on_disk(tmp_path) == ["checkpoint_000001", "checkpoint_000002"]
    assert manager.latest is not None and manager.latest.index == 2


def test_manager_from_storage_restores_kept_checkpoints(tmp_path: Path) -> None:
    _run(tmp_path, CheckpointConfig(), [1.0, 2.0])
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    restored = CheckpointManager.from_storage(CheckpointConfig(), storage)
    assert restored.latest is not None and restored.latest.metrics == {"score": 2.0}
