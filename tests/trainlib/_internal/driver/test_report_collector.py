"""The driver's report collector: complete reports, checkpoint commits, callbacks, history."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trainlib import Callback, Checkpoint, CheckpointConfig, TrainingFailedError
from trainlib._internal.common.commit_marker import FileEntry
from trainlib._internal.common.messages import (
    CheckpointsAnswer,
    CheckpointsQuery,
    RankLog,
    RankStarted,
    ReportMessage,
)
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.ranks import assign_ranks
from trainlib._internal.driver.report_collector import ReportCollector
from trainlib._internal.driver.watchdog import ProgressWatchdog
from trainlib.callbacks import Report
from trainlib.validation import ReportedCheckpointStatus


class _Reports(Callback):
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def on_report(self, report: Report) -> None:
        self.reports.append(report)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _collector(
    tmp_path: Path, world_size: int = 2, hang_timeout_s: float | None = None
) -> tuple[ReportCollector, RunStorage, _Reports, ProgressWatchdog, _Clock]:
    storage = RunStorage.create(str(tmp_path / "results"), "run")
    callback = _Reports()
    collector = ReportCollector(storage, CheckpointManager(CheckpointConfig(), storage), [callback])
    clock = _Clock()
    slots = assign_ranks([("h", f"tcp://h:{rank}") for rank in range(world_size)])
    watchdog = ProgressWatchdog(hang_timeout_s, slots, clock)
    collector.start_attempt(world_size, 0, watchdog)
    return collector, storage, callback, watchdog, clock


def _upload(storage: RunStorage, tmp_path: Path, index: int, name: str) -> dict[str, FileEntry]:
    source = tmp_path / f"rank-{index}-{name}"
    source.mkdir()
    (source / name).write_bytes(name.encode())
    return storage.upload(Checkpoint.from_directory(source), index)


def _report(
    collector: ReportCollector,
    rank: int,
    index: int,
    metrics: dict[str, float] | None = None,
    files: dict[str, FileEntry] | None = None,
) -> None:
    own = metrics if rank == 0 else None
    collector.handle(ReportMessage(rank, index, own, files))


def test_reports_complete_once_every_rank_reported(tmp_path: Path) -> None:
    collector, storage, callback, _, _ = _collector(tmp_path)
    _report(collector, 1, 0)
    assert callback.reports == [] and collector.history == []
    _report(collector, 0, 0, {"loss": 0.5})
    assert callback.reports == [Report(0, {"loss": 0.5}, None)]
    assert collector.history == [{"loss": 0.5}]
    assert storage.list_committed() == []


def test_reports_commit_every_ranks_files_as_one_checkpoint(tmp_path: Path) -> None:
    collector, storage, callback, _, _ = _collector(tmp_path)
    _report(collector, 0, 0, {"loss": 0.5}, _upload(storage, tmp_path, 0, "model.pt"))
    _report(collector, 1, 0, None, _upload(storage, tmp_path, 0, "shard-1.pt"))
    [committed] = storage.list_committed()
    assert sorted(committed.files) == ["model.pt", "shard-1.pt"]
    assert committed.metrics == {"loss": 0.5}
    [report] = callback.reports
    assert report.checkpoint is not None
    assert report.checkpoint.path == storage.checkpoint_dir(0)
    assert storage.verify(committed) is None


def test_reports_commit_a_checkpoint_that_only_rank_1_uploaded(tmp_path: Path) -> None:
    collector, storage, callback, _, _ = _collector(tmp_path)
    _report(collector, 1, 0, None, _upload(storage, tmp_path, 0, "shard-1.pt"))
    _report(collector, 0, 0, {"loss": 0.5})
    assert [sorted(c.files) for c in storage.list_committed()] == [["shard-1.pt"]]
    assert callback.reports[0].checkpoint is not None


def test_reports_without_rank_0_metrics_have_empty_metrics(tmp_path: Path) -> None:
    collector, _, callback, _, _ = _collector(tmp_path, world_size=1)
    collector.handle(ReportMessage(0, 0, None, None))
    assert callback.reports == [Report(0, {}, None)]


def test_reports_reach_callbacks_in_index_order(tmp_path: Path) -> None:
    collector, _, callback, _, _ = _collector(tmp_path)
    for index in range(3):
        _report(collector, 0, index, {"step": index})
        _report(collector, 1, index)
    assert [r.index for r in callback.reports] == [0, 1, 2]
    assert collector.history == [{"step": 0}, {"step": 1}, {"step": 2}]


def test_reports_made_by_some_ranks_only_name_them(tmp_path: Path) -> None:
    collector, _, _, _, _ = _collector(tmp_path, world_size=3)
    for rank in range(3):
        _report(collector, rank, 0, {"step": 0})
    collector.check_all_complete()
    _report(collector, 2, 1)
    _report(collector, 0, 1, {"step": 1})
    with pytest.raises(
        TrainingFailedError,
        match=r"Report 1 was made by ranks \[0, 2\] only, out of 3; every rank must call",
    ):
        collector.check_all_complete()


def test_reports_new_attempt_forgets_reports_after_its_checkpoint(tmp_path: Path) -> None:
    collector, _, _, watchdog, _ = _collector(tmp_path)
    for index in range(3):
        _report(collector, 0, index, {"step": index})
        _report(collector, 1, index)
    _report(collector, 0, 3, {"step": 3})
    collector.start_attempt(2, 2, watchdog)
    assert collector.history == [{"step": 0}, {"step": 1}]
    collector.check_all_complete()  # the half-made report 3 is gone too


def test_reports_started_messages_start_the_hang_clock(tmp_path: Path) -> None:
    collector, _, _, watchdog, clock = _collector(tmp_path, hang_timeout_s=5.0)
    clock.now += 10.0
    collector.handle(RankStarted(0, "127.0.0.1", 1))
    assert watchdog.check() == {}  # rank 1 is still starting
    collector.handle(RankStarted(1, "127.0.0.1", 2))
    clock.now += 4.0
    assert watchdog.check() == {}
    clock.now += 2.0
    assert sorted(watchdog.check()) == [0, 1]


def test_reports_log_where_each_rank_started_with_its_batch_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    collector, *_ = _collector(tmp_path, hang_timeout_s=5.0)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    in_job = RankStarted.here(1, "10.0.0.5")
    monkeypatch.delenv("SLURM_JOB_ID")
    outside = RankStarted.here(0, "10.0.0.4")
    with caplog.at_level(logging.INFO, logger="trainlib"):
        collector.handle(in_job)
        collector.handle(outside)
    assert f"rank 1 on 10.0.0.5 (pid {in_job.pid}, SLURM job 12)" in caplog.text
    assert f"rank 0 on 10.0.0.4 (pid {outside.pid})" in caplog.text


def test_reports_tell_the_watchdog_who_fell_behind(tmp_path: Path) -> None:
    collector, _, _, watchdog, clock = _collector(tmp_path, hang_timeout_s=5.0)
    for rank in (0, 1):
        collector.handle(RankStarted(rank, "127.0.0.1", rank))
    clock.now += 4.0
    _report(collector, 0, 0, {"step": 0})
    _report(collector, 1, 0)  # complete: progress, the clock restarts
    clock.now += 4.0
    assert watchdog.check() == {}
    _report(collector, 0, 1, {"step": 1})
    clock.now += 2.0
    assert list(watchdog.check()) == [1]


def test_reports_rank_0_log_records_go_to_driver_handlers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    collector, _, _, _, _ = _collector(tmp_path)
    record = logging.LogRecord(
        "cifar.train_loop", logging.INFO, "train_loop.py", 1, "epoch %d/%d", (1, 5), None
    )
    with caplog.at_level(logging.INFO):
        collector.handle(RankLog(record))
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("cifar.train_loop", "epoch 1/5")]


def test_reports_refuse_a_checkpoint_named_differently_on_two_ranks(tmp_path: Path) -> None:
    collector, storage, _, _, _ = _collector(tmp_path)
    for rank, name in ((0, "full_model"), (1, "final")):
        source = tmp_path / f"named-{rank}"
        source.mkdir()
        (source / f"rank{rank}.pt").write_bytes(b"w")
        files = storage.upload(Checkpoint.from_directory(source), 0, name)
        message = ReportMessage(rank, 0, {"loss": 1.0} if rank == 0 else None, files, name)
        if rank == 0:
            collector.handle(message)
    with pytest.raises(TrainingFailedError, match="final, full_model"):
        collector.handle(message)


def test_reports_answer_a_checkpoints_query_once_its_reports_are_processed(
    tmp_path: Path,
) -> None:
    collector, storage, _, _, _ = _collector(tmp_path)
    answers: list[tuple[int, CheckpointsAnswer]] = []
    collector.reply_with(lambda rank, answer: answers.append((rank, answer)))
    _report(collector, 0, 0, {"loss": 1.0}, _upload(storage, tmp_path, 0, "a"))
    collector.handle(CheckpointsQuery(world_rank=0, index=1))
    assert answers == []  # rank 1 has not made report 0 yet
    _report(collector, 1, 0, None, _upload(storage, tmp_path, 0, "b"))
    [(rank, answer)] = answers
    assert rank == 0
    [(checkpoint, metrics, status)] = answer.checkpoints
    assert checkpoint.path == storage.checkpoint_dir(0) and metrics == {"loss": 1.0}
    assert status is ReportedCheckpointStatus.COMMITTED


def _upload_content(
    storage: RunStorage, tmp_path: Path, rank: int, content: bytes
) -> dict[str, FileEntry]:
    source = tmp_path / f"rank-{rank}-model"
    source.mkdir()
    (source / "model.pt").write_bytes(content)
    return storage.upload(Checkpoint.from_directory(source), 0)


def test_reports_keep_one_copy_of_a_file_every_rank_reported_alike(tmp_path: Path) -> None:
    # Ray's guides have every DDP rank save the same replica under one name
    collector, storage, _, _, _ = _collector(tmp_path)
    _report(collector, 1, 0, None, _upload_content(storage, tmp_path, 1, b"replica"))
    _report(collector, 0, 0, {"loss": 0.5}, _upload_content(storage, tmp_path, 0, b"replica"))
    [committed] = storage.list_committed()
    assert sorted(committed.files) == ["model.pt"]
    assert storage.verify(committed) is None


def test_reports_record_the_copy_kept_of_a_file_ranks_reported_differently(
    tmp_path: Path,
) -> None:
    # Ray's get-started loop: every rank saves its own model.pt; the storage keeps the last
    collector, storage, _, _, _ = _collector(tmp_path)
    first = _upload_content(storage, tmp_path, 0, b"rank 0")
    second = _upload_content(storage, tmp_path, 1, b"rank one")  # written last
    _report(collector, 0, 0, {"loss": 0.5}, first)
    _report(collector, 1, 0, None, second)  # reports may arrive in either order
    [committed] = storage.list_committed()
    assert committed.files["model.pt"].size == len(b"rank one")
    assert storage.verify(committed) is None


def test_relaxed_reports_complete_with_the_surviving_ranks_in_order(tmp_path: Path) -> None:
    """relax_collectives_on_preemption: once rank 2 is preempted, reports waiting only for it
    complete at once, in order; later ones need ranks 0 and 1; rank 2's late part of a report
    already complete changes nothing."""
    collector, _, callback, _, _ = _collector(tmp_path, world_size=3)
    for index in (0, 1):
        _report(collector, 0, index, {"step": float(index)})
        _report(collector, 1, index, {"step": float(index)})
    _report(collector, 2, 0, {"step": 0.0})
    assert [r.index for r in callback.reports] == [0]  # 1 waits for rank 2
    collector.relax_to({0, 1})
    assert [r.index for r in callback.reports] == [0, 1]
    _report(collector, 2, 1, {"step": 1.0})  # late: its report is complete already
    _report(collector, 0, 2, {"step": 2.0})
    assert [r.index for r in callback.reports] == [0, 1]  # 2 waits for rank 1
    _report(collector, 1, 2, {"step": 2.0})
    assert [r.index for r in callback.reports] == [0, 1, 2]
    assert collector.history == [{"step": 0.0}, {"step": 1.0}, {"step": 2.0}]
