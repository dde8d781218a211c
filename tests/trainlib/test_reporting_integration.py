"""report() with async uploads and get_all_reported_checkpoints(), on 2 gloo ranks."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import trainlib
from trainlib import Checkpoint, CheckpointUploadMode, RunConfig, ScalingConfig, WorkerGroupError
from trainlib._internal.common.storage import RunStorage
from trainlib.torch import TorchTrainer


def _fit(func: Any, client: Client, storage: Path, config: dict[str, Any]) -> trainlib.Result:
    return TorchTrainer(
        func,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(storage)),
        client=client,
    ).fit()


def _checkpoint(content: str) -> Checkpoint:
    directory = tempfile.mkdtemp()
    Path(directory, f"rank{trainlib.get_context().get_world_rank()}.txt").write_text(content)
    return Checkpoint.from_directory(directory)


def async_steps(config: dict[str, Any]) -> None:
    """Four steps, an async checkpoint at each even one; rank 1 alone saves at the end; then
    every rank writes what get_all_reported_checkpoints() answers."""
    rank = trainlib.get_context().get_world_rank()
    for step in range(4):
        checkpoint = _checkpoint(f"step {step}") if step % 2 == 0 else None
        trainlib.report(
            {"step": step}, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.ASYNC
        )
        if checkpoint is not None:
            assert not os.path.exists(checkpoint.path)  # moved: deleted after upload by default
    last = _checkpoint("last") if rank == 1 else None
    trainlib.report({"step": 4}, checkpoint=last, checkpoint_upload_mode="async")
    reported = trainlib.get_all_reported_checkpoints()
    answer = [[os.path.basename(r.checkpoint.path), r.metrics["step"]] for r in reported]
    Path(config["out"], f"{rank}.json").write_text(json.dumps(answer))


def test_report_async_commits_in_order_and_every_rank_sees_every_checkpoint(
    dask_client: Client, tmp_path: Path
) -> None:
    result = _fit(async_steps, dask_client, tmp_path / "runs", {"out": str(tmp_path)})
    assert [m["step"] for m in result.metrics_history] == [0, 1, 2, 3, 4]
    expected = [["checkpoint_000000", 0], ["checkpoint_000002", 2], ["checkpoint_000004", 4]]
    for rank in range(2):
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == expected
    storage = RunStorage(result.filesystem, result.path)
    committed = storage.list_committed()
    assert [c.checkpoint.files()[1:] for c in committed] == [
        ["rank0.txt", "rank1.txt"],
        ["rank0.txt", "rank1.txt"],
        ["rank1.txt"],
    ]
    assert all(storage.verify(c) is None for c in committed)


def fail_at_upload(config: dict[str, Any]) -> None:
    """Async checkpoints at reports 0 and 1 (report 1's upload fails), then ``more``
    metrics-only reports."""
    for step in range(2):
        trainlib.report({"step": step}, checkpoint=_checkpoint("x"), checkpoint_upload_mode="async")
    # Report 1 waited for each rank's upload of report 0 and sent its message: past the barrier,
    # checkpoint 0 is complete on both ranks whichever rank sees the failed upload first.
    trainlib.collective.barrier()
    for step in range(config["more"]):
        trainlib.report({"step": 2 + step})
        trainlib.report(
            {"step": 2 + step}, checkpoint=_checkpoint("y"), checkpoint_upload_mode="async"
        )


@pytest.mark.parametrize("more", [1, 0], ids=["at_the_next_report", "at_the_end"])
def test_report_async_failed_upload_fails_the_run(
    dask_client: Client, tmp_path: Path, more: int
) -> None:
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint_000001").write_text("a file where the directory goes")
    with pytest.raises(WorkerGroupError, match="checkpoint_000001") as raised:
        _fit(fail_at_upload, dask_client, tmp_path / "runs", {"more": more})
    assert "checkpoint_upload_mode='async'" in str(raised.value)
    committed = RunStorage.create(str(tmp_path / "runs"), "run").list_committed()
    assert [c.index for c in committed] == [0]  # nothing after the failed upload
