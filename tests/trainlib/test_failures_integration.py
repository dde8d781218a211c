"""Failures end the attempt and never hang: real rank processes, real signals, real gloo."""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed import Client

import trainlib
from tests.helpers import rank_processes, wait_for_path
from trainlib import (
    Checkpoint,
    DaskConfig,
    FailureConfig,
    NotEnoughWorkersError,
    RunConfig,
    ScalingConfig,
    WorkerGroupError,
)
from trainlib._internal.common.commit_marker import COMMIT_MARKER
from trainlib._internal.common.storage import RunStorage
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

STOP_DEADLINE_S = 10.0


def fail_on_rank_one(config: dict[str, Any]) -> None:
    """Rank 1 fails as config['how'] says; rank 0 blocks forever, as a stuck peer would."""
    dist.barrier()
    if trainlib.get_context().get_world_rank() == 0:
        threading.Event().wait()
    Path(config["out_dir"], "failed_at").write_text(str(time.time()))
    if config["how"] == "raise":
        raise ValueError("boom from rank 1")
    if config["how"] == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def _fit(client: Client, tmp_path: Path, func: Any, config: dict[str, Any], **run: Any) -> Any:
    return TorchTrainer(
        func,
        train_loop_config={"out_dir": str(tmp_path), **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path / "results"), **run),
        client=client,
    ).fit()


def _fail(client: Client, tmp_path: Path, how: str) -> tuple[WorkerGroupError, float]:
    with pytest.raises(WorkerGroupError) as caught:
        _fit(client, tmp_path, fail_on_rank_one, {"how": how})
    elapsed = time.time() - float((tmp_path / "failed_at").read_text())
    return caught.value, elapsed


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("raise", "ValueError: boom from rank 1"),
        ("exit", "rank process exited with code 3 without reporting an error"),
        ("kill", "rank process was killed by signal SIGKILL"),
    ],
)
def test_failure_of_one_rank_stops_all_within_deadline(
    dask_client: Client, tmp_path: Path, how: str, expected: str
) -> None:
    error, elapsed = _fail(dask_client, tmp_path, how)
    assert elapsed < STOP_DEADLINE_S
    assert str(error).startswith(f"Training failed: rank 1 on host 127.0.0.1: {expected}")
    assert "  rank 0 (127.0.0.1): stopped after another rank failed" in str(error)
    assert rank_processes() == []


def test_failure_error_shows_traceback_once_and_survives_pickling(
    dask_client: Client, tmp_path: Path
) -> None:
    error, _ = _fail(dask_client, tmp_path, "raise")
    text = str(error)
    assert text.count("Traceback (most recent call last)") == 1
    assert "in fail_on_rank_one" in text
    assert str(pickle.loads(pickle.dumps(error))) == text


def test_failure_leaves_cluster_reusable(dask_client: Client, tmp_path: Path) -> None:
    _fail(dask_client, tmp_path / "first", "kill")
    result = _fit(dask_client, tmp_path / "second", report_epochs, {"epochs": 1, "die_at": -1})
    assert result.metrics == {"epoch": 0, "resumed_from": -1}


def report_epochs(config: dict[str, Any]) -> None:
    """Checkpoints every epoch and resumes from get_checkpoint(); rank 1 SIGKILLs itself once.

    The kill happens at epoch ``die_at`` of a run started from scratch, after the driver has
    committed the previous epoch's checkpoint, so the resume point is known.
    """
    rank = trainlib.get_context().get_world_rank()
    start, resumed_from = 0, -1
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resumed_from = torch.load(os.path.join(directory, "state.pt"), weights_only=True)[
                "epoch"
            ]
        start = resumed_from + 1
    if rank == 0:
        with open(Path(config["out_dir"], "starts.txt"), "a") as f:
            f.write(f"{start}\n")
    storage = Path(config["out_dir"], "results", "run")
    for epoch in range(start, config["epochs"]):
        if checkpoint is None and epoch == config["die_at"] and rank == 1:
            wait_for_path(storage / f"checkpoint_{epoch - 1:06d}" / COMMIT_MARKER)
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                torch.save({"epoch": epoch}, os.path.join(directory, "state.pt"))
            trainlib.report(
                {"epoch": epoch, "resumed_from": resumed_from},
                checkpoint=Checkpoint.from_directory(directory),
            )


def test_failure_restart_resumes_from_latest_checkpoint(
    dask_client: Client, tmp_path: Path
) -> None:
    result = _fit(
        dask_client,
        tmp_path,
        report_epochs,
        {"epochs": 4, "die_at": 2},
        failure_config=FailureConfig(max_failures=1),
    )
    assert (tmp_path / "starts.txt").read_text().split() == ["0", "2"]
    assert result.metrics == {"epoch": 3, "resumed_from": 1}
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000003")
    assert result.num_restarts == 1
    assert [f.one_line() for f in result.failures] == [
        "rank 1 (127.0.0.1): rank process was killed by signal SIGKILL"
    ]
    assert rank_processes() == []


def test_failure_without_retries_raises_after_one_attempt(
    dask_client: Client, tmp_path: Path
) -> None:
    with pytest.raises(WorkerGroupError, match="killed by signal SIGKILL"):
        _fit(dask_client, tmp_path, report_epochs, {"epochs": 4, "die_at": 1})
    assert (tmp_path / "starts.txt").read_text().split() == ["0"]


def half_written_checkpoint(config: dict[str, Any]) -> None:
    """Report 0 completes; in report 1 rank 1 uploads its files, then rank 0 dies."""
    rank = trainlib.get_context().get_world_rank()
    resumed = trainlib.get_checkpoint()
    for index in range(2):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, f"rank{rank}.bin").write_bytes(b"x" * 1000)
            if resumed is None and index == 1 and rank == 0:
                wait_for_path(
                    Path(config["out_dir"], "results", "run", "checkpoint_000001", "rank1.bin")
                )
                os.kill(os.getpid(), signal.SIGKILL)
            trainlib.report(
                {"index": index, "resumed": resumed is not None},
                checkpoint=Checkpoint.from_directory(directory),
            )


def test_failure_mid_checkpoint_leaves_nothing_listed(dask_client: Client, tmp_path: Path) -> None:
    with pytest.raises(WorkerGroupError):
        _fit(dask_client, tmp_path, half_written_checkpoint, {})
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    assert (tmp_path / "results" / "run" / "checkpoint_000001" / "rank1.bin").exists()
    assert [c.index for c in storage.list_committed()] == [0]
    # Running the same run again resumes from checkpoint 0 and discards the partial one.
    result = _fit(dask_client, tmp_path, half_written_checkpoint, {})
    assert result.metrics == {"index": 1, "resumed": True}
    assert [c.index for c in storage.list_committed()] == [0, 1, 2]


def test_failure_not_enough_workers_names_counts_and_fix(
    dask_client: Client, tmp_path: Path
) -> None:
    trainer = TorchTrainer(
        report_epochs,
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(storage_path=str(tmp_path)),
        dask_config=DaskConfig(worker_timeout_s=1),
        client=dask_client,
    )
    address = dask_client.scheduler_info(n_workers=0)["address"]
    with pytest.raises(NotEnoughWorkersError) as caught:
        trainer.fit()
    assert str(caught.value) == (
        f"ScalingConfig(num_workers=3) needs 3 Dask workers but {address} has 2 after 1 s; "
        "lower num_workers or add workers to the cluster."
    )


def test_cluster_class_is_started_scaled_and_closed(tmp_path: Path) -> None:
    result = TorchTrainer(
        report_epochs,
        train_loop_config={"out_dir": str(tmp_path), "epochs": 1, "die_at": -1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path / "results")),
        dask_config=DaskConfig(
            cluster_class="distributed.LocalCluster",
            cluster_kwargs={"n_workers": 0, "processes": False},
        ),
    ).fit()
    assert result.metrics == {"epoch": 0, "resumed_from": -1}


def test_cluster_class_that_cannot_be_imported_names_the_fix(tmp_path: Path) -> None:
    trainer = TorchTrainer(
        report_epochs,
        run_config=RunConfig(storage_path=str(tmp_path)),
        dask_config=DaskConfig(cluster_class="dask_nowhere.Cluster"),
    )
    with pytest.raises(
        trainlib.ConfigError, match=r"cluster_class='dask_nowhere\.Cluster'\) cannot be imported"
    ):
        trainer.fit()
