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


def test_a_checkpoint_awaiting_validation_is_spared_until_its_validation_ends(
    tmp_path: Path,
) -> None:
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="score")
    manager = CheckpointManager(config, storage)
    first = storage.commit(0, _commit(storage, tmp_path, 0, {}).files, {"loss": 1.0}, None, (), {})
    manager.register(first, validating=True)
    for index, score in ((1, 5.0), (2, 3.0)):  # 1 the best reported, 2 the latest
        manager.register(_commit(storage, tmp_path, index, {"score": score}))
    assert _on_disk(tmp_path) == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert [c.index for c in manager.awaiting_validation()] == [0]
    assert manager.status(first).value == "PENDING_VALIDATION"

    # A run of the same name started now would find it still waiting, from its marker.
    again = CheckpointManager.from_storage(config, storage)
    assert [c.validation for c in again.awaiting_validation()] == [{}]

    validated = manager.validated(0, {"score": 9.0})
    assert validated is not None and validated.metrics == {"loss": 1.0, "score": 9.0}
    assert manager.status(validated).value == "VALIDATED"
    # Now the best: checkpoint 1 (neither best nor latest) goes.
    assert _on_disk(tmp_path) == ["checkpoint_000000", "checkpoint_000002"]
    [reread, _] = storage.list_committed()
    assert reread.metrics == {"loss": 1.0, "score": 9.0} and reread.validated
    assert reread.validation is None and storage.verify(reread) is None


def test_a_failed_validation_ends_the_wait_and_keeps_the_reported_metrics(
    tmp_path: Path,
) -> None:
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    manager = CheckpointManager(CheckpointConfig(), storage)
    files = _commit(storage, tmp_path, 0, {}).files
    manager.register(storage.commit(0, files, {"loss": 1.0}, None, (), {"epoch": 3}), True)
    failed = manager.validated(0, None)
    assert failed is not None and failed.metrics == {"loss": 1.0}
    assert manager.status(failed).value == "COMMITTED"
    [reread] = storage.list_committed()
    assert reread.validation is None and not reread.validated  # not run again by the next run
