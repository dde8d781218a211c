from __future__ import annotations

from pathlib import Path

import pytest

from trainlib import Checkpoint, CheckpointError, Result
from trainlib._internal.common.storage import RunStorage


def _finished_run(tmp_path: Path) -> RunStorage:
    """A run directory with three committed checkpoints and one cut-off upload."""
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    for index, loss in enumerate([0.9, 0.4, 0.6]):
        source = tmp_path / f"src{index}"
        source.mkdir()
        (source / "model.pt").write_bytes(b"w")
        files = storage.upload(Checkpoint.from_directory(source), index)
        storage.commit(index, files, {"loss": loss, "epoch": index})
    storage.upload(Checkpoint.from_directory(tmp_path / "src0"), 3)
    return storage


def test_result_from_path_reads_the_committed_checkpoints_back(tmp_path: Path) -> None:
    storage = _finished_run(tmp_path)
    result = Result.from_path(tmp_path / "results" / "run")
    assert result.metrics == {"loss": 0.6, "epoch": 2}
    assert result.checkpoint == Checkpoint(storage.checkpoint_dir(2))
    assert [m["epoch"] for _, m in result.best_checkpoints] == [2, 1, 0]
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2]
    assert result.path == storage.run_dir and result.error is None


def test_result_from_path_of_no_run_says_which_folder_to_pass(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no run directory there"):
        Result.from_path(tmp_path / "nothing")


@pytest.mark.parametrize(("mode", "epoch"), [("min", 1), ("max", 0)])
def test_result_get_best_checkpoint_by_metric(tmp_path: Path, mode: str, epoch: int) -> None:
    storage = _finished_run(tmp_path)
    result = Result.from_path(storage.run_dir)
    assert result.get_best_checkpoint("loss", mode) == Checkpoint(storage.checkpoint_dir(epoch))


def test_result_get_best_checkpoint_names_the_metrics_there_are(tmp_path: Path) -> None:
    result = Result.from_path(_finished_run(tmp_path).run_dir)
    with pytest.raises(RuntimeError, match=r"has metric 'accuracy'.*\['epoch', 'loss'\]"):
        result.get_best_checkpoint("accuracy", "max")
    with pytest.raises(ValueError, match="must be 'max' or 'min'"):
        result.get_best_checkpoint("loss", "best")
