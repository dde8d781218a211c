"""TorchTrainer on a real LocalCluster with real gloo ranks (no mocks)."""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import Client
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import trainlib
from tests.helpers import wait_for_path
from trainlib import Callback, Checkpoint, CheckpointConfig, Report, Result, RunConfig, RunInfo
from trainlib.torch import TorchTrainer, prepare_data_loader, prepare_model

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

NUM_SAMPLES = 32
GLOBAL_BATCH = 8
LR = 0.1
logger = logging.getLogger(__name__)


def _dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_SAMPLES, 5, generator=generator)
    y = x @ torch.arange(1.0, 6.0).unsqueeze(1) + 0.1 * torch.randn(
        NUM_SAMPLES, 1, generator=generator
    )
    return TensorDataset(torch.arange(NUM_SAMPLES), x, y)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(5, 1)


def _record_setup(out_dir: str) -> None:
    """ScalingConfig.worker_setup: says, per rank, in which process it ran and when."""
    rank = trainlib.get_context().get_world_rank()
    seen = {"pid": os.getpid(), "group_formed": torch.distributed.is_initialized()}
    with open(os.path.join(out_dir, f"setup-rank{rank}-{os.getpid()}.json"), "x") as file:
        json.dump(seen, file)
    os.environ["TRAINLIB_TEST_SETUP_RAN"] = "yes"


def train_sgd(config: dict[str, Any]) -> None:
    """One epoch of SGD on a linear model; each rank writes what it saw to out_dir."""
    context = trainlib.get_context()
    world_size = context.get_world_size()
    model = prepare_model(_model())
    loader = prepare_data_loader(
        DataLoader(_dataset(), batch_size=GLOBAL_BATCH // world_size, num_workers=1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    seen: list[int] = []
    for step, (index, x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += index.tolist()
        with tempfile.TemporaryDirectory() as directory:
            torch.save(
                {"step": step}, os.path.join(directory, f"rank{context.get_world_rank()}.pt")
            )
            trainlib.report(
                {"step": step, "loss": loss.item()}, checkpoint=Checkpoint.from_directory(directory)
            )
        if step == 0 and context.get_world_rank() == 0:
            logger.info("rank 0 finished step %d", step)
            wait_for_path(Path(config["out_dir"], "driver-saw-report-0"))
    plain = model.module if isinstance(model, DistributedDataParallel) else model
    record = {
        "params": torch.cat([p.detach().flatten() for p in plain.parameters()]).tolist(),
        "seen": seen,
        "context": [
            context.get_world_size(),
            context.get_world_rank(),
            context.get_local_rank(),
            context.get_local_world_size(),
            context.get_node_rank(),
            context.get_experiment_name(),
        ],
        "env": {
            k: os.environ.get(k)
            for k in (
                "MALLOC_TRIM_THRESHOLD_",
                "OMP_NUM_THREADS",
                "MASTER_ADDR",
                "RANK",
                "WORLD_SIZE",
                "TRAINLIB_TEST_SETUP_RAN",
            )
        },
        "pid": os.getpid(),
        "ddp": isinstance(model, DistributedDataParallel),
    }
    Path(config["out_dir"], f"rank{context.get_world_rank()}.json").write_text(json.dumps(record))


class _Recorder(Callback):
    """Records callback calls; marks on disk that report 0 reached the driver."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.calls: list[tuple[str, Any]] = []

    def on_start(self, run: RunInfo) -> None:
        self.calls.append(("start", run))

    def on_report(self, report: Report) -> None:
        self.calls.append(("report", report))
        if report.index == 0:
            (self.out_dir / "driver-saw-report-0").touch()

    def on_end(self, result: Result) -> None:
        self.calls.append(("end", result))


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Run:
    result: Result
    ranks: list[dict[str, Any]]
    recorder: _Recorder
    logs: list[logging.LogRecord]
    out_dir: Path


def _fit(client: Client, out_dir: Path, num_workers: int) -> Run:
    out_dir.mkdir()
    recorder = _Recorder(out_dir)
    handler = _ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        result = TorchTrainer(
            train_sgd,
            train_loop_config={"out_dir": str(out_dir)},
            scaling_config=trainlib.ScalingConfig(
                num_workers=num_workers,
                worker_setup=functools.partial(_record_setup, str(out_dir)),
            ),
            run_config=RunConfig(
                name="sgd",
                storage_path=str(out_dir / "results"),
                callbacks=[recorder],
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
            client=client,
        ).fit()
    finally:
        logger.removeHandler(handler)
    ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(num_workers)]
    return Run(result, ranks, recorder, handler.records, out_dir)


@pytest.fixture(scope="module")
def two_ranks(dask_client: Client, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _fit(dask_client, tmp_path_factory.mktemp("two") / "out", num_workers=2)


@pytest.fixture(scope="module")
def one_rank(dask_client: Client, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _fit(dask_client, tmp_path_factory.mktemp("one") / "out", num_workers=1)


def _reference_params() -> list[float]:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _, x, y in DataLoader(_dataset(), batch_size=GLOBAL_BATCH):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def test_ddp_ranks_end_with_identical_parameters(two_ranks: Run) -> None:
    assert two_ranks.ranks[0]["params"] == two_ranks.ranks[1]["params"]


def test_ddp_ranks_see_disjoint_halves_covering_the_data(two_ranks: Run) -> None:
    seen0, seen1 = (set(r["seen"]) for r in two_ranks.ranks)
    assert len(seen0) == len(seen1) == NUM_SAMPLES // 2
    assert seen0.isdisjoint(seen1)
    assert seen0 | seen1 == set(range(NUM_SAMPLES))


def test_ddp_two_half_batches_equal_one_full_batch(two_ranks: Run) -> None:
    assert torch.allclose(
        torch.tensor(two_ranks.ranks[0]["params"]), torch.tensor(_reference_params()), atol=1e-5
    )


def test_trainer_context_and_rank_environment(two_ranks: Run) -> None:
    contexts = sorted(r["context"] for r in two_ranks.ranks)
    assert contexts == [[2, 0, 0, 2, 0, "sgd"], [2, 1, 1, 2, 0, "sgd"]]
    for rank, record in enumerate(two_ranks.ranks):
        env = record["env"]
        assert env["MALLOC_TRIM_THRESHOLD_"] is None  # not inherited from Dask's nanny
        assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == (str(rank), "2", "127.0.0.1")
        assert int(env["OMP_NUM_THREADS"]) >= 1


def test_trainer_worker_setup_runs_once_per_rank_before_the_group_forms(two_ranks: Run) -> None:
    for rank, record in enumerate(two_ranks.ranks):
        setups = list(two_ranks.out_dir.glob(f"setup-rank{rank}-*.json"))
        assert len(setups) == 1
        seen = json.loads(setups[0].read_text())
        assert seen == {"pid": record["pid"], "group_formed": False}
        assert record["env"]["TRAINLIB_TEST_SETUP_RAN"] == "yes"


def test_trainer_result_holds_metrics_history_and_kept_checkpoints(two_ranks: Run) -> None:
    result = two_ranks.result
    steps = NUM_SAMPLES // GLOBAL_BATCH
    assert result.metrics["step"] == steps - 1
    assert list(result.metrics_dataframe["step"]) == list(range(steps))
    assert result.error is None
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000003")
    assert [c.path[-6:] for c, _ in result.best_checkpoints] == ["000003", "000002"]
    with result.checkpoint.as_directory() as directory:
        assert sorted(os.listdir(directory)) == [".trainlib-commit.json", "rank0.pt", "rank1.pt"]
        assert torch.load(os.path.join(directory, "rank1.pt"), weights_only=True) == {"step": 3}


def test_trainer_callbacks_get_reports_while_training_runs(two_ranks: Run) -> None:
    # Rank 0 waited for the driver's on_report(0) before training on, so fit() finishing
    # proves the report reached the driver during training.
    kinds = [kind for kind, _ in two_ranks.recorder.calls]
    assert kinds == ["start", "report", "report", "report", "report", "end"]
    reports = [payload for kind, payload in two_ranks.recorder.calls if kind == "report"]
    assert [r.index for r in reports] == [0, 1, 2, 3]
    assert all(r.checkpoint is not None for r in reports)


def test_trainer_forwards_rank_zero_logs_to_driver(two_ranks: Run) -> None:
    messages = [r.getMessage() for r in two_ranks.logs]
    assert "rank 0 finished step 0" in messages


def test_trainer_single_rank_runs_without_ddp(one_rank: Run) -> None:
    assert one_rank.ranks[0]["ddp"] is False
    assert torch.allclose(
        torch.tensor(one_rank.ranks[0]["params"]), torch.tensor(_reference_params()), atol=1e-5
    )


def test_trainer_outside_training_function_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match="inside the train_loop_per_worker"):
        trainlib.report({"loss": 1.0})
    with pytest.raises(RuntimeError, match=r"get_context\(\) was called outside"):
        trainlib.get_context()


def test_trainer_rejects_function_with_two_arguments() -> None:
    with pytest.raises(trainlib.ConfigError, match="takes 2 arguments"):
        TorchTrainer(lambda a, b: None)
