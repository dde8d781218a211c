"""Ctrl-C ends fit() within 10 s with every rank stopped, whatever the run is doing."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import rank_processes, trainlib_processes, wait_for_path

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

EXIT_WITHIN_S = 10.0

DRIVER = """
import os, sys, tempfile, threading
import trainlib
from stuck_storage import StuckUploads
from trainlib.torch import TorchTrainer

PHASE, MARKER, STORAGE = sys.argv[1:4]


def mark():
    open(MARKER, "w").close()


def block_forever():
    mark()
    threading.Event().wait()


class BlockWhenLoaded:
    # Unpickled by each rank with the train function: the ranks block while starting up.
    def __reduce__(self):
        return (block_forever, ())


def train_func(config):
    rank = trainlib.get_context().get_world_rank()
    if PHASE == "training":
        trainlib.report({"step": 0})
        if rank == 0:
            mark()
        threading.Event().wait()
    elif PHASE == "upload":
        with tempfile.TemporaryDirectory() as directory:
            open(os.path.join(directory, "state.txt"), "w").write("state")
            trainlib.report({"step": 0}, checkpoint=trainlib.Checkpoint.from_directory(directory))
    elif PHASE == "teardown":
        if rank == 0:
            mark()
            return  # rank 0 waits for rank 1 at the barrier that ends the process group
        threading.Event().wait()


TorchTrainer(
    train_func,
    train_loop_config={"block": BlockWhenLoaded()} if PHASE == "startup" else {},
    scaling_config=trainlib.ScalingConfig(num_workers=2),
    run_config=trainlib.RunConfig(
        storage_path=STORAGE,
        storage_filesystem=StuckUploads(marker=MARKER) if PHASE == "upload" else None,
    ),
).fit()
"""


# A module of its own: fsspec filesystem classes defined in __main__ cannot be pickled by value.
STUCK_STORAGE = """
import threading
from fsspec.implementations.local import LocalFileSystem


class StuckUploads(LocalFileSystem):
    # Checkpoint uploads that never finish: the ranks stay inside report(checkpoint=...).
    def __init__(self, marker, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def put(self, *args, **kwargs):
        open(self.marker, "w").close()
        threading.Event().wait()
"""


def _forked_ranks(servers: list[psutil.Process], count: int) -> list[psutil.Process]:
    """The servers' children, once there are ``count`` (the other rank may still be forking
    when the first marks the phase), or what there is after 30 s."""
    deadline = time.monotonic() + 30
    ranks = [rank for server in servers for rank in server.children()]
    while len(ranks) < count and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process table, not waiting out a delay
        ranks = [rank for server in servers for rank in server.children()]
    return ranks


@pytest.mark.parametrize("phase", ["startup", "training", "upload", "teardown"])
def test_ctrl_c_stops_every_rank_within_deadline(phase: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(DRIVER))
    (tmp_path / "stuck_storage.py").write_text(textwrap.dedent(STUCK_STORAGE))
    marker = tmp_path / "in-phase"
    driver = subprocess.Popen(
        [sys.executable, str(script), phase, str(marker), str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_path(marker)
        # Each of the 2 workers (threads of the driver) has its fork server, a child of the
        # driver, which forks the worker's rank (see trainlib._internal.worker.rank_pool).
        servers = [p for p in trainlib_processes() if p.ppid() == driver.pid]
        assert len(servers) == 2, [p.pid for p in servers]
        ranks = _forked_ranks(servers, 2)
        assert len(ranks) == 2, [p.pid for p in ranks]  # one rank per server, no more
        driver.send_signal(signal.SIGINT)
        _, stderr = driver.communicate(timeout=EXIT_WITHIN_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode != 0
    assert stderr.decode().rstrip().endswith("KeyboardInterrupt")
    assert [p.pid for p in ranks if p.is_running() and p.status() != "zombie"] == []
    assert rank_processes() == []
    # the servers exit as soon as their end of the driver's sockets closes
    assert psutil.wait_procs(servers, timeout=EXIT_WITHIN_S)[1] == []
