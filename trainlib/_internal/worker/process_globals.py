"""What trainlib keeps in a Dask worker process between tasks, in one place: ``WORKER``.

Everything is keyed by worker address: a LocalCluster's workers are threads of one process.
Two things outlive a task: each worker's fork servers (``rank_pool``), and where a live group's
commands go on each worker: the connection of the rank its supervisor runs (``command_relay``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlib._internal.worker.fork_client import ForkedProcess, ForkServer


@dataclass
class RankProcess:
    """A forked rank process and the supervisor's end of its connection."""

    process: ForkedProcess
    connection: Connection
    environment: dict[str, str]


@dataclass
class WorkerGlobals:
    """This process's workers' fork servers and command routes, each under its own lock."""

    pool_lock: threading.Lock = field(default_factory=threading.Lock)
    # worker address -> its fork servers: one, unless the environment changed while a rank of
    # the old one still runs
    fork_servers: dict[str, list[ForkServer]] = field(default_factory=dict)
    relay_lock: threading.Lock = field(default_factory=threading.Lock)
    # (group token, worker address) -> the send of the rank the worker's supervisor runs
    command_routes: dict[tuple[str, str], Callable[[Any], None]] = field(default_factory=dict)


WORKER = WorkerGlobals()
