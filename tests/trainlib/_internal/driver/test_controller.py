"""The controller's state machine: attempts, restarts from the latest checkpoint, giving up.

The cluster and the ranks are stand-ins given to the controller as its placement: every
selection finds two slots, and each attempt's worker group replays a script of rank messages
and failures into the controller's handler. Storage is a real run directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from fsspec.implementations.local import LocalFileSystem

from trainlib import (
    Callback,
    DaskConfig,
    FailureConfig,
    RankFailure,
    Report,
    Result,
    RunConfig,
    RunInfo,
    ScalingConfig,
    TorchConfig,
    TrainingFailedError,
    WorkerGroupError,
)
from trainlib._internal.common.messages import RankSpec, ReportMessage
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.controller import TrainController
from trainlib._internal.driver.group_status import GroupStatus
from trainlib._internal.driver.ranks import WorkerSlot, assign_ranks
from trainlib._internal.driver.run_plan import RunPlan

SLOTS = assign_ranks([("host", "tcp://w0"), ("host", "tcp://w1")])
Handle = Callable[[Any], None]
Script = Callable[[Handle, RunStorage], dict[int, RankFailure]]


class Recorder(Callback):
    def __init__(self) -> None:
        self.starts: list[RunInfo] = []
        self.reports: list[Report] = []
        self.ends: list[Result] = []

    def on_start(self, run: RunInfo) -> None:
        self.starts.append(run)

    def on_report(self, report: Report) -> None:
        self.reports.append(report)

    def on_end(self, result: Result) -> None:
        self.ends.append(result)


class ScriptedGroup:
    """An attempt's worker group whose ranks say what the script makes them say: the first
    poll plays it; a failure ends the failed ranks, and stopping the group the others."""

    def __init__(
        self, script: Script, storage: RunStorage, handle: Handle, unresponsive: set[str], size: int
    ) -> None:
        self._script = script
        self._storage = storage
        self._handle = handle
        self.unresponsive_workers = unresponsive
        self.size = size
        self.polls = 0
        self._failures: dict[int, RankFailure] = {}

    def poll(self, timeout_s: float) -> GroupStatus:
        if self.polls == 0:
            self._failures = self._script(self._handle, self._storage)
        self.polls += 1
        everyone = not self._failures or getattr(self._script, "others_ended", False)
        ended = frozenset(range(self.size)) if everyone else frozenset(self._failures)
        # a preempted rank's end is named when the group is stopped: until then its process
        # exited on a worker seen retiring
        retiring = frozenset(r for r, f in self._failures.items() if f.kind == "preempted")
        seen = {
            r: replace(f, kind="exit") if r in retiring else f for r, f in self._failures.items()
        }
        return GroupStatus(self.size, ended, seen, retiring)

    def fail(self, failures: dict[int, RankFailure]) -> GroupStatus:
        raise AssertionError("the scripts hang no rank")

    def stop(self) -> GroupStatus:
        stopped = RankFailure(0, "host", "stopped", "stopped after another rank failed")
        for rank in range(self.size):
            self._failures.setdefault(rank, stopped)
        return GroupStatus(
            self.size, frozenset(range(self.size)), dict(self._failures), stopped=True
        )

    def send(self, message: Any) -> None:
        pass

    def send_to(self, world_rank: int, message: Any) -> None:
        pass


class Attempts:
    """The controller's placement: the client given, no GPU claims, two slots for every
    attempt (each selection's excluded workers kept), then a group playing the attempt's
    script; keeps each rank's spec."""

    def __init__(self, *scripts: Script, unresponsive: tuple[set[str], ...] = ()) -> None:
        self._scripts = list(scripts)
        self._unresponsive = list(unresponsive)
        self.specs: list[list[RankSpec]] = []
        self.selections: list[frozenset[str]] = []
        self.groups: list[ScriptedGroup] = []

    @contextmanager
    def connect(self, plan: Any, client: Any) -> Iterator[Any]:
        yield client

    @contextmanager
    def claims(self, client: Any, owner: str) -> Iterator[None]:
        yield None

    def select(
        self, client: Any, plan: Any, unresponsive: frozenset[str], poll: Any, claims: Any
    ) -> list[WorkerSlot]:
        self.selections.append(unresponsive)
        return SLOTS

    @contextmanager
    def start(
        self, client: Any, slots: list[WorkerSlot], build: Any, handle: Handle, resources: Any
    ) -> Iterator[ScriptedGroup]:
        launches = [build(slot, slot.host, 29500) for slot in slots]
        specs: list[RankSpec] = [cloudpickle.loads(launch.spec_payload) for launch in launches]
        self.specs.append(specs)
        unresponsive = self._unresponsive.pop(0) if self._unresponsive else set()
        script = self._scripts.pop(0)
        group = ScriptedGroup(script, specs[0].storage, handle, unresponsive, len(slots))
        self.groups.append(group)
        yield group


class Client:
    """The client a run is given: the controller only registers the rank pool's plugin."""

    def register_plugin(self, plugin: Any) -> None:
        pass


def report(index: int, metrics: dict[str, Any], checkpoint_dir: Path | None = None) -> Script:
    """Both ranks make report ``index``; rank 0 with ``metrics`` and the checkpoint's files."""

    def script(handle: Handle, storage: RunStorage) -> dict[int, RankFailure]:
        files = storage.upload_directory(str(checkpoint_dir), index) if checkpoint_dir else None
        handle(ReportMessage(0, index, metrics, files))
        handle(ReportMessage(1, index, None, {} if files is not None else None))
        return {}

    return script


def then(*scripts: Script) -> Script:
    def script(handle: Handle, storage: RunStorage) -> dict[int, RankFailure]:
        failures: dict[int, RankFailure] = {}
        for step in scripts:
            failures = step(handle, storage)
        return failures

    return script


def fail(handle: Handle, storage: RunStorage) -> dict[int, RankFailure]:
    return {1: RankFailure(1, "host", "exception", "RuntimeError: boom", time=0.0)}


def preempted(handle: Handle, storage: RunStorage) -> dict[int, RankFailure]:
    return {1: RankFailure(1, "host", "preempted", "Dask worker tcp://w1 retired", time=0.0)}


def preempted_the_others_ended(handle: Handle, storage: RunStorage) -> dict[int, RankFailure]:
    return preempted(handle, storage)


preempted_the_others_ended.others_ended = True  # type: ignore[attr-defined]


def run(
    tmp_path: Path,
    attempts: Attempts,
    max_failures: int = 0,
    lease: Any = None,
    recorder: Recorder | None = None,
    failure_config: FailureConfig | None = None,
) -> tuple[Result, Recorder]:
    recorder = recorder or Recorder()
    plan = RunPlan(
        train_func_payload=b"",
        scaling=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=str(tmp_path / "runs"),
            failure_config=failure_config or FailureConfig(max_failures=max_failures),
            callbacks=[recorder],
        ),
        torch_config=TorchConfig(),
        dask_config=DaskConfig(),
        lease=lease,
    )
    controller = TrainController(plan, attempts)
    return controller.run(Client()), recorder  # type: ignore[arg-type]


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "local_checkpoint"
    directory.mkdir()
    (directory / "model.pt").write_bytes(b"weights")
    return directory


def test_controller_restarts_from_the_latest_checkpoint_after_a_failure(
    tmp_path: Path, checkpoint_dir: Path
) -> None:
    attempts = Attempts(
        then(report(0, {"loss": 1.0}, checkpoint_dir), report(1, {"loss": 0.9}), fail),
        report(1, {"loss": 0.5}),
    )
    result, recorder = run(tmp_path, attempts, max_failures=1)
    first, second = attempts.specs
    assert [spec.start_index for spec in first + second] == [0, 0, 1, 1]
    assert second[0].latest_checkpoint is not None
    assert second[0].latest_checkpoint.path.endswith("checkpoint_000000")
    assert result.metrics == {"loss": 0.5}
    assert result.metrics_history == [{"loss": 1.0}, {"loss": 0.5}]  # report 1 was redone
    assert [f.summary for f in result.failures] == ["RuntimeError: boom"]
    assert len(recorder.starts) == 1 and recorder.starts[0].world_size == 2
    assert [r.index for r in recorder.reports] == [0, 1, 1]


def test_controller_logs_each_state_of_the_run_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trainlib._internal.driver.controller")
    run(tmp_path, Attempts(fail, report(0, {"loss": 1.0})), max_failures=1)
    states = [r.getMessage() for r in caplog.records if r.name.endswith("controller")]
    assert states == [
        "Run run scheduling attempt 1",
        "Run run starting (attempt 1) on 2 ranks from scratch",
        "Run run restarting after failure 1: rank 1 (host): RuntimeError: boom",
        "Run run scheduling attempt 2",
        "Run run starting (attempt 2) on 2 ranks from scratch",
        "Run run finished",
    ]


def test_controller_gives_up_once_max_failures_is_used_up(
    tmp_path: Path,
) -> None:
    attempts = Attempts(fail, fail, report(0, {"loss": 1.0}))
    with pytest.raises(WorkerGroupError, match="boom") as raised:
        run(tmp_path, attempts, max_failures=1)
    assert len(attempts.specs) == 2
    assert raised.value.num_restarts == 1


def test_controller_tells_the_callbacks_how_a_failed_run_ended(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    with pytest.raises(WorkerGroupError) as raised:
        run(tmp_path, Attempts(fail), recorder=recorder)
    (ended,) = recorder.ends
    assert ended.error is raised.value
    assert len(recorder.starts) == 1


def test_controller_without_a_limit_restarts_until_an_attempt_succeeds(
    tmp_path: Path,
) -> None:
    attempts = Attempts(fail, fail, fail, report(0, {"loss": 1.0}))
    result, _ = run(tmp_path, attempts, max_failures=-1)
    assert len(attempts.specs) == 4
    assert len(result.failures) == 3
    assert result.metrics == {"loss": 1.0}


def test_controller_avoids_workers_whose_rank_did_not_stop(
    tmp_path: Path,
) -> None:
    class Lease:
        def __init__(self) -> None:
            self.withheld: list[set[str]] = []

        def allowed(self, eligible: Any) -> Any:
            return eligible

        def withhold(self, addresses: set[str]) -> None:
            self.withheld.append(set(addresses))

    attempts = Attempts(fail, report(0, {}), unresponsive=({"tcp://w1"}, set()))
    lease = Lease()
    run(tmp_path, attempts, max_failures=1, lease=lease)
    assert attempts.selections == [frozenset(), frozenset({"tcp://w1"})]
    assert lease.withheld == [{"tcp://w1"}, set()]


def test_controller_fails_a_run_whose_ranks_reported_unequally(
    tmp_path: Path,
) -> None:
    def rank_0_only(handle: Handle, storage: RunStorage) -> dict[int, RankFailure]:
        handle(ReportMessage(0, 0, {"loss": 1.0}, None))
        return {}

    with pytest.raises(TrainingFailedError, match=r"made by ranks \[0\] only, out of 2"):
        run(tmp_path, Attempts(rank_0_only))


def test_controller_resumes_a_run_directory_that_has_checkpoints(
    tmp_path: Path, checkpoint_dir: Path
) -> None:
    storage = RunStorage(LocalFileSystem(), str(tmp_path / "runs" / "run"))
    files = storage.upload_directory(str(checkpoint_dir), 4)
    storage.commit(4, files, {"loss": 0.3})
    attempts = Attempts(report(5, {"loss": 0.2}))
    result, recorder = run(tmp_path, attempts)
    assert attempts.specs[0][1].start_index == 5
    resumed = recorder.starts[0].resumed_from
    assert resumed is not None and resumed.index == 4 and resumed.metrics == {"loss": 0.3}
    assert result.metrics == {"loss": 0.2}


def test_controller_waits_out_the_preemption_grace_then_restarts_counting_a_preemption(
    tmp_path: Path,
) -> None:
    config = FailureConfig(max_preemption_failures=1, preemption_grace_s=0.3)
    attempts = Attempts(preempted, report(0, {"loss": 1.0}))
    started = time.monotonic()
    result, _ = run(tmp_path, attempts, failure_config=config)
    assert time.monotonic() - started >= 0.3  # the survivor was given the grace
    assert attempts.groups[0].polls > 1  # polled again while waiting
    assert [f.kind for f in result.failures] == ["preempted"]  # within its own budget
    assert result.metrics == {"loss": 1.0}


def test_controller_without_a_grace_stops_the_others_at_once(tmp_path: Path) -> None:
    config = FailureConfig(max_preemption_failures=1)
    attempts = Attempts(preempted, report(0, {"loss": 1.0}))
    result, _ = run(tmp_path, attempts, failure_config=config)
    assert attempts.groups[0].polls == 1
    assert [f.kind for f in result.failures] == ["preempted"]


def test_controller_waits_for_no_grace_once_every_rank_ended(tmp_path: Path) -> None:
    """The survivors of a preemption ended before their grace did: nothing is left to wait
    for, so the attempt is decided on at once."""
    config = FailureConfig(max_preemption_failures=1, preemption_grace_s=60)
    attempts = Attempts(preempted_the_others_ended, report(0, {"loss": 1.0}))
    started = time.monotonic()
    result, _ = run(tmp_path, attempts, failure_config=config)
    assert time.monotonic() - started < 30  # not the grace's 60 s
    assert attempts.groups[0].polls == 1
    assert [f.kind for f in result.failures] == ["preempted"]
    assert result.metrics == {"loss": 1.0}
