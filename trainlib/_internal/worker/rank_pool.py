"""Warm rank processes: each Dask worker forks its ranks from a fork server with torch imported.

Starting a rank costs a Python interpreter, ``import torch`` and what DDP imports (seconds of
CPU). Each worker keeps one fork server (``rank.fork_server``) started with its environment:
when a run registers the pool's plugin (or earlier, by ``DaskConfig.connect(warm_ranks=True)``:
the import then overlaps what the driver does before ``fit()``). Every rank is then forked from
it in milliseconds: the second ``fit()`` on a cluster, a retry and a search's back-to-back trials
all start warm, whoever made the cluster, and nothing has to be refilled while ranks train. A
forked process is used by one rank only, so nothing of one run's state reaches the next. The
server exits when its worker closes (the plugin stops it) or dies (its end of the socket
closes); the ranks it forked end with their own connections.
"""

from __future__ import annotations

import os
from typing import Any

import dask
from distributed.diagnostics.plugin import WorkerPlugin

from trainlib._internal.common.messages import is_private
from trainlib._internal.worker.fork_client import ForkServer, ForkServerGone
from trainlib._internal.worker.process_globals import WORKER, RankProcess

PLUGIN_NAME = "trainlib-rank-pool"


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
    """A new rank process forked by the worker's server for this environment (started now if
    there is none, or it died). Private variables (``is_private``) may differ: the launch sets
    them as they are now."""
    for _ in range(2):  # a server found dead is replaced once
        server = _server(worker, environment)
        try:
            process, connection = server.fork()
        except ForkServerGone:
            continue
        return RankProcess(process, connection, environment)
    raise RuntimeError(
        f"the rank process server of Dask worker {worker} exited before it could fork a rank; "
        "check the worker's memory and its log"
    )


def _server(worker: str, environment: dict[str, str]) -> ForkServer:
    """The worker's live server for this configuration; servers of another configuration
    with no rank left running are stopped."""
    wanted = _configuration(environment)
    retired = []
    with WORKER.pool_lock:
        servers = WORKER.fork_servers.setdefault(worker, [])
        found = None
        for server in list(servers):
            if server.alive() and _configuration(server.environment) == wanted:
                found = server
            elif not server.has_children():
                servers.remove(server)
                retired.append(server)
        if found is None:
            found = ForkServer(environment)
            servers.append(found)
    for server in retired:
        server.stop()
    return found


def _configuration(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if not is_private(k)}


def close(worker: str) -> None:
    """Stop the worker's fork servers (the worker is closing)."""
    with WORKER.pool_lock:
        servers = WORKER.fork_servers.pop(worker, [])
    for server in servers:
        server.stop()


class RankPoolPlugin(WorkerPlugin):
    """Starts a worker's fork server, and stops it when the worker closes.

    Registered by every run under ``PLUGIN_NAME`` (and by ``connect(warm_ranks=True)``).
    Without it, the server of a LocalCluster whose workers are threads would outlive the
    cluster.
    """

    name = PLUGIN_NAME
    idempotent = True  # registered again by every run: keep the first, never tear it down

    def setup(self, worker: Any) -> None:
        _server(worker.address, process_environment(dict(os.environ)))

    def teardown(self, worker: Any) -> None:
        close(worker.address)
