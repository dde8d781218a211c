"""Warm rank processes: a started process, torch already imported, waiting for its launch.

Starting a rank costs a Python interpreter and ``import torch`` (about 1.5 s of CPU here).
Each Dask worker keeps one idle process ready: the first is started when a run registers the
pool's plugin (or earlier, by ``DaskConfig.connect(warm_ranks=True)``: the import then overlaps
what the driver does before ``fit()``), a rank takes it, and its supervisor starts the next
one at once, so it imports torch while the rank trains and the following run on a warm cluster
(a Tuner's next trial, a second ``fit()``) starts at once. A process is used by one rank
only, so nothing of one run's state reaches the next. An idle process exits when its worker
closes (the pool's worker plugin stops it) or dies (its end of the socket closes).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import dask
from distributed.diagnostics.plugin import WorkerPlugin

PLUGIN_NAME = "trainlib-rank-pool"


@dataclass
class RankProcess:
    """A started rank process and the supervisor's end of its connection."""

    process: subprocess.Popen[bytes]
    connection: Connection
    environment: dict[str, str]


_lock = threading.Lock()
_idle: dict[str, RankProcess] = {}  # worker address -> its idle process


def process_environment(worker_env: dict[str, str]) -> dict[str, str]:
    """A rank process's environment: the worker's, without what Dask's nanny set for itself.

    The nanny sets MALLOC_TRIM_THRESHOLD_=65536 and thread limits of 1 for its worker; a torch
    step inheriting MALLOC_TRIM_THRESHOLD_ ran 2.2x slower here.
    """
    env = dict(worker_env)
    for key, value in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items():
        if env.get(key) == str(value):
            del env[key]
    return env


def take(worker: str, environment: dict[str, str]) -> RankProcess:
    """The worker's idle process if it was started with this environment, else a new one."""
    with _lock:
        idle = _idle.pop(worker, None)
    if idle is not None:
        if idle.environment == environment and idle.process.poll() is None:
            return idle
        stop(idle)
    return start(environment)


def refill(worker: str, environment: dict[str, str]) -> None:
    """Start the worker's next idle process, unless it has one."""
    with _lock:
        if worker in _idle:
            return
        _idle[worker] = start(environment)


def close(worker: str) -> None:
    """Stop the worker's idle process (the worker is closing)."""
    with _lock:
        idle = _idle.pop(worker, None)
    if idle is not None:
        stop(idle)


def start(environment: dict[str, str]) -> RankProcess:
    """A new rank process in its own session; it imports torch, then waits for its launch."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainlib._internal.rank_main", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        env=environment,
        start_new_session=True,
    )
    theirs.close()
    return RankProcess(process, ours, environment)


def stop(rank: RankProcess) -> None:
    """Kill an idle process (it has started nothing of its own yet)."""
    rank.connection.close()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rank.process.pid, 9)
    rank.process.wait()


class RankPoolPlugin(WorkerPlugin):
    """Starts a worker's first idle rank process, and stops its idle process when it closes.

    Registered by every run under ``PLUGIN_NAME`` (and by ``connect(warm_ranks=True)``).
    Without it, the idle process of a LocalCluster whose workers are threads would outlive
    the cluster.
    """

    name = PLUGIN_NAME
    idempotent = True  # registered again by every run: keep the first, never tear it down

    def setup(self, worker: Any) -> None:
        refill(worker.address, process_environment(dict(os.environ)))

    def teardown(self, worker: Any) -> None:
        close(worker.address)
