"""The training slot's lease: a holder killed frees it within the lease timeout; a holder
that freezes is fenced: its ranks stop themselves before its lease can lapse, so the training
queued behind it never trains beside them, and the holder, once it runs again, fails as
``fenced`` (the train task's retry resumes it) instead of training on without the slot.

The scheduler is this test's own, with leases validated every half second; each training
process has its own host slot files, so only the cluster's semaphore keeps them apart (as on the
compose stack, whose scheduler is not on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest
from distributed import LocalCluster

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

LEASE_S = 12.0  # the ranks stop after 6 s of silence; the lease lapses after 12 s

HOLDER = """
import json, os, sys, time
from pathlib import Path

import trainlib
from tasks.training_slot import training_slot
from trainlib import DaskConfig, FailureConfig, RunConfig, ScalingConfig, WorkerGroupError
from trainlib.torch import TorchTrainer

address, folder, lease = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])


def train(config):
    rank = trainlib.get_context().get_world_rank()
    Path(config["folder"], f"pid-{rank}").write_text(str(os.getpid()))
    beats = Path(config["folder"], f"beats-{rank}")
    while True:
        with beats.open("a") as f:
            f.write(f"{time.time()}\\n")
        trainlib.report({"t": time.time()})
        time.sleep(0.1)  # a training step


with training_slot(DaskConfig(address=address), "frozen", lease_timeout_s=lease) as config:
    try:
        TorchTrainer(
            train,
            train_loop_config={"folder": str(folder)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="frozen",
                storage_path=str(folder / "runs"),
                failure_config=FailureConfig(max_failures=-1),
            ),
            dask_config=config,
        ).fit()
    except WorkerGroupError as error:
        root = error.root_cause
        print(json.dumps({"kind": root.kind, "restarts": error.num_restarts, "error": str(error)}))
"""

KILLED = """
import sys, time
from tasks.training_slot import training_slot
from trainlib import DaskConfig

with training_slot(DaskConfig(address=sys.argv[1]), "killed", lease_timeout_s=float(sys.argv[2])):
    print("holding", flush=True)
    time.sleep(600)  # held until killed
"""

QUEUED = """
import sys, time
from tasks.training_slot import training_slot
from trainlib import DaskConfig

with training_slot(DaskConfig(address=sys.argv[1]), "queued", lease_timeout_s=float(sys.argv[2])):
    print(time.time(), flush=True)
"""


@pytest.fixture
def scheduler() -> Iterator[str]:
    """A cluster of two worker processes whose scheduler checks leases every half second."""
    with (
        dask.config.set({"distributed.scheduler.locks.lease-validation-interval": "500ms"}),
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        as cluster,
    ):  # fmt: skip
        yield cluster.scheduler_address


def _start(script: Path, *args: str, lock_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "CIFAR_TRAINING_LOCK_DIR": str(lock_dir)}
    repo = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, str(script), *args], cwd=repo, env=env, stdout=subprocess.PIPE, text=True
    )


def _wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _last_beat(folder: Path) -> float:
    beats = [(folder / f"beats-{rank}").read_text().split() for rank in (0, 1)]
    return max(float(line) for lines in beats for line in lines)


def test_a_frozen_holders_ranks_stop_before_a_queued_training_gets_the_slot(
    scheduler: str, tmp_path: Path
) -> None:
    holder_py, queued_py = tmp_path / "holder.py", tmp_path / "queued.py"
    holder_py.write_text(textwrap.dedent(HOLDER))
    queued_py.write_text(textwrap.dedent(QUEUED))
    holder = _start(holder_py, scheduler, str(tmp_path), str(LEASE_S), lock_dir=tmp_path / "a")
    queued = None
    try:
        beating = [tmp_path / f"beats-{rank}" for rank in (0, 1)]
        _wait_for(lambda: all(p.exists() and p.read_text() for p in beating), 180, "both ranks")
        pids = [int((tmp_path / f"pid-{rank}").read_text()) for rank in (0, 1)]
        os.kill(holder.pid, signal.SIGSTOP)
        frozen_at = time.time()
        queued = _start(queued_py, scheduler, str(LEASE_S), lock_dir=tmp_path / "b")
        assert queued.stdout is not None
        acquired_at = float(queued.stdout.readline())
        assert queued.wait(timeout=60) == 0
        # The queued training got the slot once the lease lapsed, and the frozen holder's
        # ranks had stopped before: no beat of theirs after it, no process of theirs left.
        assert acquired_at - frozen_at >= LEASE_S / 2
        assert _last_beat(tmp_path) < acquired_at
        assert not any(_alive(pid) for pid in pids)
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        if queued is not None and queued.poll() is None:
            queued.kill()
    out, _ = holder.communicate(timeout=120)
    assert holder.returncode == 0
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["kind"] == "fenced"
    assert outcome["restarts"] == 0  # FailureConfig(max_failures=-1), yet never restarted
    assert "its driver was not heard from for" in outcome["error"]
    assert "DaskConfig(driver_timeout_s=6)" in outcome["error"]


def test_the_slot_of_a_killed_holder_frees_within_the_lease_timeout(
    scheduler: str, tmp_path: Path
) -> None:
    killed_py, queued_py = tmp_path / "killed.py", tmp_path / "queued.py"
    killed_py.write_text(textwrap.dedent(KILLED))
    queued_py.write_text(textwrap.dedent(QUEUED))
    holder = _start(killed_py, scheduler, str(LEASE_S), lock_dir=tmp_path / "a")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        holder.kill()
        holder.wait()
        killed_at = time.time()
        queued = _start(queued_py, scheduler, str(LEASE_S), lock_dir=tmp_path / "b")
        assert queued.stdout is not None
        freed_after = float(queued.stdout.readline()) - killed_at
        assert queued.wait(timeout=60) == 0
    finally:
        holder.kill()
        holder.wait()
    assert LEASE_S - 2 <= freed_after < LEASE_S + 10  # refreshed every LEASE_S / 5 till killed
