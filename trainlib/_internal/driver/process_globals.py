"""The driver process's own state: what outlives a run, or is shared by the threads of runs.

Everything of one run lives in its objects (``Run``, ``WorkerGroup``, ...) and is passed
explicitly. Two things are process-wide by nature, and are kept here, in ``DRIVER``:

- the cluster classes this process started, by scheduler address, while they run: a wait for
  workers on one, also through a ``DaskConfig`` that has only its address (``attached_to``),
  replaces workers whose jobs ended and, when it times out, names the jobs still queued;
- whether Ctrl-C was pressed while a run was in flight (``interrupt``): a Tuner's trial
  threads all see the main thread's Ctrl-C.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StartedCluster:
    """A cluster class instance started by ``connect``, and the workers it was asked for."""

    cluster: Any
    num_workers: int
    adaptive: bool

    def replace_lost_workers(self) -> None:
        """Ask the cluster to start again the workers of its plan that are gone.

        A SpecCluster (dask-jobqueue's clusters are ones) forgets a worker whose job ended
        ``distributed.deploy.lost-worker-timeout`` (15 s) after it left; ``scale`` then submits
        a new job for it. Adaptive clusters keep their own size; this re-opens their plan.
        """
        target = len(getattr(self.cluster, "plan", ())) if self.adaptive else self.num_workers
        if target > 0:
            self.cluster.scale(target)


@dataclass
class DriverGlobals:
    """The state this process shares between runs and threads; every access is thread-safe."""

    interrupt_requested: threading.Event = field(default_factory=threading.Event)
    _started: dict[str, StartedCluster] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def started_cluster(self, address: str) -> StartedCluster | None:
        """The cluster class started here whose scheduler is at ``address``, if any."""
        with self._lock:
            return self._started.get(address)

    def remember_cluster(self, address: str, started: StartedCluster) -> None:
        """A cluster class started here runs its scheduler at ``address``."""
        with self._lock:
            self._started[address] = started

    def forget_cluster(self, address: str) -> None:
        """The cluster at ``address`` was closed."""
        with self._lock:
            self._started.pop(address, None)


DRIVER = DriverGlobals()
