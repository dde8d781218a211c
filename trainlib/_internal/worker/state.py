"""What trainlib keeps in a Dask worker process between tasks, in one place: ``WORKER``.

Everything is keyed by worker address: a LocalCluster's workers are threads of one process.
Two things outlive a task: each worker's idle rank processes and how many it keeps
(``rank_pool``), and where a live group's commands go on each worker: the connection of the
rank its supervisor runs (``command_relay``).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any


@dataclass
class RankProcess:
    """A started rank process and the supervisor's end of its connection."""

    process: subprocess.Popen[bytes]
    connection: Connection
    environment: dict[str, str]


@dataclass
class WorkerState:
    """This process's workers' rank pools and command routes, each under its own lock."""

    pool_lock: threading.Lock = field(default_factory=threading.Lock)
    idle: dict[str, list[RankProcess]] = field(default_factory=dict)  # oldest first
    wanted: dict[str, int] = field(default_factory=dict)  # idle processes kept (default 1)
    relay_lock: threading.Lock = field(default_factory=threading.Lock)
    # (group token, worker address) -> the send of the rank the worker's supervisor runs
    command_routes: dict[tuple[str, str], Callable[[Any], None]] = field(default_factory=dict)


WORKER = WorkerState()
