"""Local mode, as Ray Train's ``ScalingConfig(num_workers=0)``: the training function runs in
the calling process, with the same report, context and checkpoint API, and no cluster."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import dask.dataframe as dd
import pandas as pd
import pytest
import torch
from torch import nn

import trainlib
from trainlib import (
    Checkpoint,
    ConfigError,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    WorkerGroupError,
    tune,
)
from trainlib.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_three_epochs(config: dict[str, Any]) -> None:
    context = trainlib.get_context()
    model = prepare_model(nn.Linear(2, 1))
    data = prepare_data_loader(torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4))
    start = 0
    if (checkpoint := trainlib.get_checkpoint()) is not None:
        with checkpoint.as_directory() as directory:
            start = int(Path(directory, "epoch").read_text()) + 1
    for epoch in range(start, config["epochs"]):
        if epoch == config.get("fail_at"):
            raise ValueError("the loss is NaN")
        if epoch == config.get("fail_once_at") and not os.environ.get("TRAINLIB_TEST_FAILED_ONCE"):
            os.environ["TRAINLIB_TEST_FAILED_ONCE"] = "1"  # this process: local mode's
            raise ValueError("the loss is NaN")
        loss = sum(model(batch).pow(2).mean() for batch in data)
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "epoch").write_text(str(epoch))
            trainlib.report(
                {
                    "epoch": epoch,
                    "loss": float(loss.detach()),
                    "pid": os.getpid(),
                    "world": (context.get_world_rank(), context.get_world_size()),
                    "kept": len(trainlib.get_all_reported_checkpoints()),
                },
                checkpoint=Checkpoint.from_directory(directory),
            )


def _fit(tmp_path: Path, max_failures: int = 0, **config: Any) -> trainlib.Result:
    return TorchTrainer(
        train_three_epochs,
        train_loop_config={"epochs": 3, **config},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="local",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    ).fit()


def test_local_mode_runs_in_this_process_and_commits_its_checkpoints(tmp_path: Path) -> None:
    result = _fit(tmp_path)
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2]
    assert {m["pid"] for m in result.metrics_history} == {os.getpid()}
    assert result.metrics["world"] == [0, 1]  # a tuple reported: JSON's list
    assert [m["kept"] for m in result.metrics_history] == [0, 1, 2]  # the earlier reports'
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert Path(directory, "epoch").read_text() == "2"
    with pytest.raises(RuntimeError, match="outside a training function"):
        trainlib.get_context()  # the session ended with the run


def test_local_mode_resumes_a_run_by_name_and_reports_a_failure_as_a_rank_would(
    tmp_path: Path,
) -> None:
    _fit(tmp_path, epochs=2)
    with pytest.raises(WorkerGroupError, match=r"rank 0 on host .*: ValueError: the loss is NaN"):
        _fit(tmp_path, epochs=3, fail_at=2)
    resumed = _fit(tmp_path, epochs=3)
    assert [m["epoch"] for m in resumed.metrics_history] == [2]  # from epoch 1's checkpoint
    assert resumed.metrics["kept"] == 2


def test_local_mode_restarts_from_its_latest_checkpoint_as_its_failure_config_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINLIB_TEST_FAILED_ONCE", raising=False)  # unset again after
    result = _fit(tmp_path, max_failures=1, fail_once_at=1)
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2]  # epoch 1 done again
    assert [f.summary for f in result.failures] == ["ValueError: the loss is NaN"]
    assert {m["pid"] for m in result.metrics_history} == {os.getpid()}


def read_two_passes(config: dict[str, Any]) -> None:
    """Every pass of the "train" shard: its ids, and the pids that computed its rows."""
    shard = trainlib.get_dataset_shard("train")
    passes = []
    for _ in range(2):
        batches = list(shard.iter_torch_batches(batch_size=5))
        passes.append([int(i) for batch in batches for i in batch["id"]])
    pids = {int(p) for batch in shard.iter_batches(batch_size=None) for p in batch["pid"]}
    trainlib.report({"passes": passes, "pids": sorted(pids)})


def _with_pid(frame: pd.DataFrame) -> pd.DataFrame:
    if (frame["id"] == 13).any() and os.environ.get("FAIL_ON_13"):
        raise ValueError("row 13 cannot be read")
    return frame.assign(pid=os.getpid())


def test_local_mode_reads_datasets_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's local mode with datasets=: the Dask collection is computed here, partition by
    partition, each pass whole (split or not: a world of one); shuffle_seed orders passes."""
    frame = dd.from_pandas(pd.DataFrame({"id": range(20)}), npartitions=4)
    dataset = frame.map_partitions(_with_pid, meta={"id": "i8", "pid": "i8"})

    def fit(name: str, config: DataConfig) -> trainlib.Result:
        return TorchTrainer(
            read_two_passes,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name=name, storage_path=str(tmp_path)),
            datasets={"train": dataset},
            dataset_config=config,
        ).fit()

    ordered = fit("ordered", DataConfig())
    assert ordered.metrics["passes"] == [list(range(20))] * 2
    assert ordered.metrics["pids"] == [os.getpid()]
    shuffled = fit("shuffled", DataConfig(shuffle_seed=7)).metrics["passes"]
    assert all(sorted(p) == list(range(20)) for p in shuffled)
    assert shuffled[0] != shuffled[1]  # another partition order per pass
    monkeypatch.setenv("FAIL_ON_13", "1")
    with pytest.raises(WorkerGroupError, match=r"datasets\['train'\] in local mode failed.*13"):
        fit("failing", DataConfig())


def test_local_mode_cannot_be_searched() -> None:
    local = TorchTrainer(train_three_epochs, scaling_config=ScalingConfig(num_workers=0))
    with pytest.raises(ConfigError, match=r"local mode runs one run in this process"):
        tune.Tuner(local)


class RaisesOnReport(trainlib.Callback):
    def on_report(self, report: trainlib.Report) -> None:
        raise ConnectionError("the dashboard refused the report")


def test_local_mode_raises_what_a_callback_raised_never_counting_it_a_failure(
    tmp_path: Path,
) -> None:
    """A callback's error stops the run as in any run: raised by ``fit()`` as it is, the
    training function not run again however many failures the FailureConfig allows."""
    trainer = TorchTrainer(
        train_three_epochs,
        train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="local",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=2),
            callbacks=[RaisesOnReport()],
        ),
    )
    with pytest.raises(ConnectionError, match="the dashboard refused the report"):
        trainer.fit()
    restored = trainlib.Result.from_path(tmp_path / "local")
    assert [m["epoch"] for m in restored.metrics_history] == [0]  # ran once, stopped at once
