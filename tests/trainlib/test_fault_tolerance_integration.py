"""Hangs, lost Dask workers, corrupt checkpoints and Ctrl-C: real processes and signals."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist
from distributed import Client, LocalCluster

import trainlib
from tests.helpers import local_cluster, rank_processes, wait_for_path
from tests.trainlib.test_failures_integration import report_epochs
from trainlib import Checkpoint, FailureConfig, RunConfig, ScalingConfig, WorkerGroupError
from trainlib._internal.common.commit_marker import COMMIT_MARKER
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

HANG_TIMEOUT_S = 3.0
# Measured here: the hang was named 3.007 s after the driver saw the last report complete
# (its loop polls every 0.5 s), and fit() raised 0.16-0.18 s later (5 runs).
HANG_DETECTED_WITHIN_S = 1.5  # beyond HANG_TIMEOUT_S
HANG_STOPPED_WITHIN_S = 5.0  # a rank ignoring SIGTERM is killed after 3 s


def block_after_first_report(config: dict[str, Any]) -> None:
    """Both ranks report once; then rank 1 blocks forever and rank 0 waits for it. Rank 1
    writes the time of its last report."""
    rank = trainlib.get_context().get_world_rank()
    reported = time.time()
    trainlib.report({"step": 0})
    if rank == 1:
        Path(config["out_dir"], "rank-1-reported").write_text(repr(reported))
        threading.Event().wait()
    trainlib.report({"step": 1})
    dist.barrier()


class _ReportTimes(trainlib.Callback):
    """When the driver saw each report complete (the watchdog's clock restarts then)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_report(self, report: trainlib.Report) -> None:
        self.times.append(time.time())


def test_hung_rank_is_detected_and_named(dask_client: Client, tmp_path: Path) -> None:
    report_times = _ReportTimes()
    trainer = TorchTrainer(
        block_after_first_report,
        train_loop_config={"out_dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path),
            failure_config=FailureConfig(hang_timeout_s=HANG_TIMEOUT_S),
            callbacks=[report_times],
        ),
        client=dask_client,
    )
    with pytest.raises(WorkerGroupError) as caught:
        trainer.fit()
    ended = time.time()
    hang = caught.value.failures[1]
    assert hang.kind == "hang"
    # Fired no earlier than HANG_TIMEOUT_S after rank 1's last report, and within the driver's
    # poll (0.5 s) and some slack of HANG_TIMEOUT_S after that report reached the driver.
    assert hang.time - float((tmp_path / "rank-1-reported").read_text()) > HANG_TIMEOUT_S
    assert len(report_times.times) == 1
    assert hang.time - report_times.times[0] < HANG_TIMEOUT_S + HANG_DETECTED_WITHIN_S
    assert ended - hang.time < HANG_STOPPED_WITHIN_S  # the ranks stopped, fit() raised
    text = str(caught.value)
    assert text.startswith("Training failed: rank 1 on host 127.0.0.1: made no progress for")
    assert "its last report was #0" in text
    assert rank_processes() == []


def epochs_with_lost_worker(config: dict[str, Any]) -> None:
    """report_epochs, but rank 1 kills its own Dask worker process (not itself) at epoch 1."""
    rank = trainlib.get_context().get_world_rank()
    checkpoint = trainlib.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = torch.load(os.path.join(directory, "state.pt"), weights_only=True)["epoch"] + 1
    if rank == 0:
        with open(Path(config["out_dir"], "starts.txt"), "a") as f:
            f.write(f"{start} {trainlib.get_context().get_world_size()}\n")
    for epoch in range(start, 3):
        if checkpoint is None and epoch == 1 and rank == 1:
            wait_for_path(
                Path(config["out_dir"], "results", "run", "checkpoint_000000", COMMIT_MARKER)
            )
            # the Dask worker whose fork server (this rank's parent) forked this rank
            os.kill(psutil.Process(os.getppid()).ppid(), signal.SIGKILL)
            threading.Event().wait()
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                torch.save({"epoch": epoch}, os.path.join(directory, "state.pt"))
            trainlib.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(directory))


@pytest.fixture
def worker_process_cluster() -> Iterator[Client]:
    """Dask workers as nanny-supervised processes, which restart a killed worker."""
    with local_cluster(2, processes=True) as client:
        yield client


def test_lost_dask_worker_restarts_from_checkpoint(
    worker_process_cluster: Client, tmp_path: Path
) -> None:
    result = TorchTrainer(
        epochs_with_lost_worker,
        train_loop_config={"out_dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=1),
        ),
        client=worker_process_cluster,
    ).fit()
    assert (tmp_path / "starts.txt").read_text().split("\n")[:2] == ["0 2", "1 2"]
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2]
    assert result.num_restarts == 1
    assert result.failures[0].world_rank == 1
    assert result.failures[0].kind == "worker_lost", result.failures
    assert re.fullmatch(r"Dask worker tcp://\S+ left the cluster", result.failures[0].summary)
    assert rank_processes() == []


def test_corrupt_latest_checkpoint_is_skipped_on_resume(
    dask_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def fit(epochs: int) -> trainlib.Result:
        return TorchTrainer(
            report_epochs,
            train_loop_config={"out_dir": str(tmp_path), "epochs": epochs, "die_at": -1},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="run", storage_path=str(tmp_path / "results")),
            client=dask_client,
        ).fit()

    fit(2)
    state = tmp_path / "results" / "run" / "checkpoint_000001" / "state.pt"
    state.write_bytes(state.read_bytes()[:-8] + b"garbage!")
    with caplog.at_level(logging.WARNING, logger="trainlib"):
        result = fit(3)
    assert "checkpoint_000001" in caplog.text and "is corrupt" in caplog.text
    assert (tmp_path / "starts.txt").read_text().split() == ["0", "1"]
    assert result.metrics == {"epoch": 2, "resumed_from": 0}


BLOCKING_DRIVER = """
import sys, threading
import trainlib
from trainlib.torch import TorchTrainer

def train_func(config):
    trainlib.report({"step": 0})
    if trainlib.get_context().get_world_rank() == 0:
        open(config["marker"], "w").close()
    threading.Event().wait()

address = sys.argv[3] if len(sys.argv) > 3 else None  # an existing cluster, or a LocalCluster
TorchTrainer(train_func, train_loop_config={"marker": sys.argv[1]},
             scaling_config=trainlib.ScalingConfig(num_workers=2),
             run_config=trainlib.RunConfig(storage_path=sys.argv[2]),
             dask_config=trainlib.DaskConfig(address=address)).fit()
"""


def _start_blocking_driver(tmp_path: Path, *address: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A driver whose ranks report once, then block forever; returns it and its marker."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(BLOCKING_DRIVER))
    marker = tmp_path / "reported"
    driver = subprocess.Popen(
        [sys.executable, str(script), str(marker), str(tmp_path / "out"), *address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return driver, marker


def elastic_epochs(config: dict[str, Any]) -> None:
    """Checkpoints every epoch; in the first attempt rank 0 dies once the cluster has grown."""
    context = trainlib.get_context()
    checkpoint = trainlib.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = torch.load(os.path.join(directory, "state.pt"), weights_only=True)["epoch"] + 1
    if context.get_world_rank() == 0:
        with open(Path(config["out_dir"], "starts.txt"), "a") as f:
            f.write(f"{start}:{context.get_world_size()}\n")
    for epoch in range(start, 3):
        if checkpoint is None and epoch == 1:
            wait_for_path(Path(config["out_dir"], "grown"))
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as directory:
            if context.get_world_rank() == 0:
                torch.save({"epoch": epoch}, os.path.join(directory, "state.pt"))
            trainlib.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(directory))


class _GrowCluster(trainlib.Callback):
    """After the first report, adds a Dask worker and says so on disk."""

    def __init__(self, cluster: LocalCluster, client: Client, marker: Path) -> None:
        self.cluster, self.client, self.marker = cluster, client, marker
        self.world_sizes: list[int] = []
        self.groups: list[tuple[str, trainlib.GroupInfo]] = []

    def on_start(self, run: trainlib.RunInfo) -> None:
        self.world_sizes.append(run.world_size)

    def on_group_start(self, group: trainlib.GroupInfo) -> None:
        self.groups.append(("start", group))

    def on_group_end(self, group: trainlib.GroupInfo) -> None:
        self.groups.append(("end", group))

    def on_report(self, report: trainlib.Report) -> None:
        if report.index == 0:
            self.cluster.scale(2)
            self.client.wait_for_workers(2, timeout=60)
            self.marker.touch()


def test_elastic_group_starts_small_and_reforms_with_the_workers_alive(tmp_path: Path) -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        grow = _GrowCluster(cluster, client, tmp_path / "grown")
        result = TorchTrainer(
            elastic_epochs,
            train_loop_config={"out_dir": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=(1, 2)),
            run_config=RunConfig(
                name="run",
                storage_path=str(tmp_path / "results"),
                failure_config=FailureConfig(max_failures=1),
                callbacks=[grow],
            ),
            client=client,
        ).fit()
        worker_addresses = list(client.scheduler_info()["workers"])
    assert (tmp_path / "starts.txt").read_text().split() == ["0:1", "1:2"]
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2]
    assert result.num_restarts == 1
    assert grow.world_sizes == [1]  # the group that formed, not num_workers' maximum
    # Each group, the first and the re-formed one, is announced with where its ranks run.
    assert [(event, g.attempt, len(g.ranks)) for event, g in grow.groups] == [
        ("start", 1, 1),
        ("end", 1, 1),
        ("start", 2, 2),
        ("end", 2, 2),
    ]
    second = grow.groups[2][1]
    assert [p.world_rank for p in second.ranks] == [0, 1]
    assert sorted(p.worker for p in second.ranks) == sorted(worker_addresses)
    assert second.hosts == {second.ranks[0].host: second.ranks[0].worker}  # one host, two ranks
    assert second.ranks[0].host == second.ranks[1].host


def report_until_grown(config: dict[str, Any]) -> None:
    """Checkpoints a step every 50 ms until the group has two ranks (at most 1,200 steps)."""
    context = trainlib.get_context()
    checkpoint = trainlib.get_checkpoint()
    step = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            step = torch.load(os.path.join(directory, "state.pt"), weights_only=True)["step"] + 1
    while True:
        with tempfile.TemporaryDirectory() as directory:
            if context.get_world_rank() == 0:
                torch.save({"step": step}, os.path.join(directory, "state.pt"))
            metrics = {"step": step, "world_size": context.get_world_size()}
            trainlib.report(metrics, checkpoint=Checkpoint.from_directory(directory))
        if context.get_world_size() == 2 or step >= 1200:
            return
        step += 1
        time.sleep(0.05)  # a training step's time: the driver looks for workers meanwhile


def test_elastic_group_grows_when_workers_join_without_a_failure(tmp_path: Path) -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        grow = _GrowCluster(cluster, client, tmp_path / "grown")
        result = TorchTrainer(
            report_until_grown,
            scaling_config=ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=0.5),
            run_config=RunConfig(
                storage_path=str(tmp_path / "results"),
                failure_config=FailureConfig(max_failures=0),
                callbacks=[grow],
            ),
            client=client,
        ).fit()
    assert result.metrics["world_size"] == 2
    assert result.num_restarts == 0 and result.failures == []
    steps = list(result.metrics_dataframe["step"])
    assert steps[0] == 0 and steps[-1] > 0  # the larger group went on from a checkpoint
    assert [(event, len(g.ranks)) for event, g in grow.groups] == [
        ("start", 1),
        ("end", 1),
        ("start", 2),
        ("end", 2),
    ]


def report_steps_until_resumed(config: dict[str, Any]) -> None:
    """Checkpoints a step every 50 ms; after a resume, two more steps and it is done."""
    checkpoint = trainlib.get_checkpoint()
    step = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            step = torch.load(os.path.join(directory, "state.pt"), weights_only=True)["step"] + 1
    last = step + 2 if checkpoint is not None else 1200
    while True:
        with tempfile.TemporaryDirectory() as directory:
            if trainlib.get_context().get_world_rank() == 0:
                torch.save({"step": step}, os.path.join(directory, "state.pt"))
            trainlib.report({"step": step}, checkpoint=Checkpoint.from_directory(directory))
        if step >= last:
            return
        step += 1
        time.sleep(0.05)  # a training step's time


class _RetireRankOne(trainlib.Callback):
    """After the first report, retires rank 1's Dask worker gracefully, as a preemption (or
    dask worker --lifetime, or an adaptive cluster scaling down) does."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.workers: list[str] = []
        self.retirement: threading.Thread | None = None

    def on_group_start(self, group: trainlib.GroupInfo) -> None:
        self.workers = [placement.worker for placement in group.ranks]

    def on_report(self, report: trainlib.Report) -> None:
        if report.index == 0 and self.retirement is None:
            worker = self.workers[1]
            self.retirement = threading.Thread(
                target=self.client.retire_workers, args=([worker],), daemon=True
            )
            self.retirement.start()


def _preempted_fit(client: Client, tmp_path: Path, budget: int) -> trainlib.Result:
    retire = _RetireRankOne(client)
    try:
        return TorchTrainer(
            report_steps_until_resumed,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                storage_path=str(tmp_path),
                failure_config=FailureConfig(max_failures=0, max_preemption_failures=budget),
                callbacks=[retire],
            ),
            client=client,
        ).fit()
    finally:
        if retire.retirement is not None:
            retire.retirement.join()


def _three_workers() -> LocalCluster:
    return LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0")


def test_a_gracefully_retired_worker_is_a_preemption_within_its_own_budget(
    tmp_path: Path,
) -> None:
    with _three_workers() as cluster, Client(cluster) as client:
        result = _preempted_fit(client, tmp_path, budget=1)
    [preemption] = result.failures
    assert preemption.kind == "preempted" and preemption.world_rank == 1
    assert "retired gracefully (preempted)" in preemption.summary
    steps = list(result.metrics_dataframe["step"])
    assert steps[-1] == steps[-3] + 2 and steps[-3] > 0  # resumed from a checkpoint


def test_a_preemption_past_its_budget_fails_the_run_naming_it(tmp_path: Path) -> None:
    with (
        _three_workers() as cluster,
        Client(cluster) as client,
        pytest.raises(WorkerGroupError, match=r"rank 1 .*retired gracefully \(preempted\)"),
    ):
        _preempted_fit(client, tmp_path, budget=0)


def checkpoint_when_preempted(config: dict[str, Any]) -> None:
    """Checkpoints its first step only, then once more when told of a preemption (rank 0
    writes it). Rank 1, whose worker the test retires after the first report, makes no report
    after that one: it waits to be stopped with its worker. After a resume, two steps and it
    is done."""
    checkpoint = trainlib.get_checkpoint()
    rank = trainlib.get_context().get_world_rank()
    step, saved = 0, False
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            step = torch.load(os.path.join(directory, "state.pt"), weights_only=True)["step"] + 1
    last = step + 2 if checkpoint is not None else 1200
    while True:
        info = trainlib.get_preemption_info()
        if checkpoint is None and rank == 1 and step >= 1:
            threading.Event().wait()  # its worker is leaving: it is stopped with it
        if step == 0 or (info is not None and not saved and checkpoint is None):
            saved = info is not None
            with tempfile.TemporaryDirectory() as directory:
                if rank == 0:
                    torch.save({"step": step}, os.path.join(directory, "state.pt"))
                checkpointed = Checkpoint.from_directory(directory)
                trainlib.report({"step": step, "jit": saved}, checkpoint=checkpointed)
        else:
            trainlib.report({"step": step, "jit": False})
        if step >= last:
            return
        step += 1
        time.sleep(0.05)  # a training step's time


def test_survivors_of_a_preemption_commit_a_checkpoint_within_the_grace(tmp_path: Path) -> None:
    """Ray's relax_collectives_on_preemption and preemption_grace_s: once rank 1's worker
    retires, rank 0 commits a just-in-time checkpoint alone (rank 1 never reports it) and the
    run resumes from it."""
    with _three_workers() as cluster, Client(cluster) as client:
        retire = _RetireRankOne(client)
        failure_config = trainlib.FailureConfig(  # Ray's guide, as written there
            max_preemption_failures=-1,
            # Complete `report` and `get_preemption_info` without the workers on
            # the preempted node.
            relax_collectives_on_preemption=True,
            # Keep the surviving workers running for up to two minutes past the
            # drain deadline, so that a slow checkpoint upload can finish.
            preemption_grace_s=120.0,
        )
        try:
            result = TorchTrainer(
                checkpoint_when_preempted,
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(
                    storage_path=str(tmp_path), failure_config=failure_config, callbacks=[retire]
                ),
                client=client,
            ).fit()
        finally:
            if retire.retirement is not None:
                retire.retirement.join()
    [preemption] = result.failures
    assert preemption.kind == "preempted" and preemption.world_rank == 1
    history = result.metrics_history
    jit = [h for h in history if h["jit"]]
    assert len(jit) == 1  # the one just-in-time checkpoint, committed by rank 0 alone
    assert [h["step"] for h in history[-3:]] == [jit[0]["step"] + i for i in (1, 2, 3)]
    assert jit[0]["step"] > 0  # not the first step's checkpoint


def test_elastic_minimum_not_met_names_the_setting(dask_client: Client, tmp_path: Path) -> None:
    trainer = TorchTrainer(
        elastic_epochs,
        train_loop_config={"out_dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=(3, 4)),
        run_config=RunConfig(storage_path=str(tmp_path)),
        dask_config=trainlib.DaskConfig(worker_timeout_s=1),
        client=dask_client,
    )
    with pytest.raises(
        trainlib.NotEnoughWorkersError,
        match=r"num_workers=\(3, 4\)\) needs 3 Dask workers but .* has 2 after 1 s",
    ):
        trainer.fit()


RANKS_EXIT_S = 30.0


def test_killed_driver_leaves_no_ranks_on_an_existing_cluster(
    dask_client: Client, tmp_path: Path
) -> None:
    address = dask_client.scheduler_info(n_workers=0)["address"]
    driver, marker = _start_blocking_driver(tmp_path, address)
    try:
        wait_for_path(marker)
        assert len(rank_processes()) == 2
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + RANKS_EXIT_S
    while rank_processes() and time.monotonic() < deadline:
        time.sleep(0.1)  # Dask cancels the dead client's tasks; supervisors then stop ranks
    assert rank_processes() == []
