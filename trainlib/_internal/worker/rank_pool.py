"""Warm rank processes: a started process, torch already imported, waiting for its launch.

Starting a rank costs a Python interpreter and ``import torch`` (about 1.5 s of CPU here).
Each Dask worker keeps one idle process ready: the first is started when a run registers the
pool's plugin (or earlier, by ``DaskConfig.connect(warm_ranks=True)``: the import then overlaps
what the driver does before ``fit()``), a rank takes it, and its supervisor starts the next
one when the rank ends, so the following run on a warm cluster (a second ``fit()``, a retry)
starts at once; not earlier, as its import would take CPU from the ranks. A Tuner whose trials
follow each other faster than a process imports torch asks for more idle processes per worker
while it runs (``keep_idle``); those are refilled at once, while the ranks train. A process is
used by one rank only, so nothing of one run's state reaches the next. An idle process exits
when its worker closes (the pool's worker plugin stops it) or dies (its end of the socket
closes).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dask
import psutil
from distributed.comm.addressing import get_address_host
from distributed.diagnostics.plugin import WorkerPlugin

from trainlib._internal.common.messages import is_private
from trainlib._internal.worker.state import WORKER, RankProcess

if TYPE_CHECKING:
    from distributed import Client

PLUGIN_NAME = "trainlib-rank-pool"
MAX_IDLE_PER_WORKER = 4
# An idle process holds an interpreter with torch imported: 283 MiB of its own here (torch
# 2.14 CPU; docs/benchmarks.md). The extra idle processes of a host's workers use at most
# IDLE_MEMORY_SHARE of the memory available on it.
IDLE_PROCESS_BYTES = 300 * 2**20
IDLE_MEMORY_SHARE = 0.1


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
    """The worker's oldest idle process started with this environment, else a new one.

    Private variables (``is_private``) may differ: the launch sets them as they are now.
    """
    unusable = []
    taken = None
    wanted = _configuration(environment)
    with WORKER.pool_lock:
        idle = WORKER.idle.get(worker, [])
        while idle and taken is None:
            candidate = idle.pop(0)
            alive = candidate.process.poll() is None
            if alive and _configuration(candidate.environment) == wanted:
                taken = candidate
            else:
                unusable.append(candidate)
    for process in unusable:
        stop(process)
    return taken if taken is not None else start(environment)


def _configuration(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if not is_private(k)}


def keeps(worker: str) -> int:
    """How many idle processes the worker keeps now (1 unless a search asked for more)."""
    with WORKER.pool_lock:
        return WORKER.wanted.get(worker, 1)


def refill(worker: str, environment: dict[str, str]) -> None:
    """Start idle processes until the worker has as many as it keeps."""
    with WORKER.pool_lock:
        idle = WORKER.idle.setdefault(worker, [])
        while len(idle) < WORKER.wanted.get(worker, 1):
            idle.append(start(environment))


def keep_idle(count: int, workers_on_host: int = 1, dask_worker: Any = None) -> None:
    """Runs on a Dask worker (``Client.run``): keep ``count`` idle processes from now on (fewer
    if the host's memory is short: see ``IDLE_MEMORY_SHARE``), starting the missing ones and
    stopping the surplus."""
    worker = dask_worker.address
    if count > 1:
        budget = psutil.virtual_memory().available * IDLE_MEMORY_SHARE / workers_on_host
        count = max(1, min(count, 1 + int(budget // IDLE_PROCESS_BYTES)))
    with WORKER.pool_lock:
        WORKER.wanted[worker] = count
        surplus = WORKER.idle.get(worker, [])[count:]
        del WORKER.idle.setdefault(worker, [])[count:]
    for process in surplus:
        stop(process)
    refill(worker, process_environment(dict(os.environ)))


@contextlib.contextmanager
def idle_processes(client: Client, count: int) -> Iterator[None]:
    """Every worker keeps ``count`` idle processes (at most ``MAX_IDLE_PER_WORKER``) while the
    block runs, and one again afterwards."""
    count = max(1, min(count, MAX_IDLE_PER_WORKER))
    if count > 1:
        by_host = collections.defaultdict(list)
        for address in client.scheduler_info(n_workers=-1)["workers"]:
            by_host[get_address_host(address)].append(address)
        for addresses in by_host.values():
            client.run(keep_idle, count, len(addresses), workers=addresses)
    try:
        yield
    finally:
        if count > 1:
            with contextlib.suppress(Exception):  # the cluster may be gone (Ctrl-C, a crash)
                client.run(keep_idle, 1)


def close(worker: str) -> None:
    """Stop the worker's idle processes (the worker is closing)."""
    with WORKER.pool_lock:
        idle = WORKER.idle.pop(worker, [])
        WORKER.wanted.pop(worker, None)
    for process in idle:
        stop(process)


def start(environment: dict[str, str]) -> RankProcess:
    """A new rank process in its own session; it imports torch, then waits for its launch."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainlib._internal.rank.rank_main", str(theirs.fileno())],
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
