"""The Dask cluster: start a LocalCluster or a cluster class, or connect to one.

A cluster class started here (e.g. dask-jobqueue's SLURMCluster) is remembered by its scheduler
address while it runs (``process_globals.DRIVER``), so that any wait for workers on it
(``workers``) can replace workers whose jobs ended and name the jobs still queued.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dask
from distributed import Client, LocalCluster
from distributed.utils import import_term

from trainlib._internal.driver.process_globals import DRIVER, StartedCluster
from trainlib._internal.driver.worker_selection import select_workers
from trainlib._internal.worker import plugins
from trainlib.config import ScalingConfig
from trainlib.errors import ConfigError

if TYPE_CHECKING:
    from trainlib._internal.driver.run_plan import ClusterOptions

logger = logging.getLogger(__name__)


@contextmanager
def connect(
    config: ClusterOptions,
    num_workers: int,
    client: Client | None = None,
    wait: bool = False,
    warm_ranks: bool = False,
) -> Iterator[Client]:
    """Yield a client of the cluster to use; clusters started here are closed afterwards.

    A cluster started here gets ``num_workers`` workers: a LocalCluster is made with that
    many, a cluster class is scaled to it (unless ``adapt_kwargs`` makes it adaptive). With
    ``wait``, the client is yielded once the cluster has ``num_workers`` workers. With
    ``warm_ranks``, every worker starts its fork server of rank processes now (``rank_pool``).

    Raises:
        NotEnoughWorkersError: With ``wait``: fewer workers after ``config.worker_timeout_s``.
    """
    with _client(config, num_workers, client) as connected:
        if warm_ranks:
            plugins.install(connected)
        if wait:
            select_workers(
                connected, ScalingConfig(num_workers=num_workers), config.worker_timeout_s
            )
        yield connected


@contextmanager
def _client(config: ClusterOptions, num_workers: int, client: Client | None) -> Iterator[Client]:
    if client is not None:
        yield client
        return
    address = config.address
    if not address and not config.cluster_class:
        address = dask.config.get("scheduler-address", None)  # $DASK_SCHEDULER_ADDRESS
    if address:
        with Client(address) as remote:
            logger.info("Connected to Dask at %s (dashboard %s)", address, remote.dashboard_link)
            yield remote
        return
    with _start_cluster(config, num_workers) as cluster, Client(cluster) as own:
        logger.info(
            "Started %s at %s (dashboard %s)",
            type(cluster).__name__,
            cluster.scheduler_address,
            own.dashboard_link,
        )
        yield own


@contextmanager
def _start_cluster(config: ClusterOptions, num_workers: int) -> Iterator[Any]:
    if config.cluster_class is None:
        # Workers are threads of this process: ranks are processes of their own, so nothing
        # heavy runs in a worker. It starts in milliseconds and, unlike spawned worker
        # processes, never re-imports a script that lacks an `if __name__ == "__main__"` guard
        # (Ray's examples have none).
        kwargs: dict[str, Any] = {
            "n_workers": num_workers,
            "threads_per_worker": 1,
            "processes": False,
            "protocol": "tcp://",
            "host": "127.0.0.1",
            "dashboard_address": ":0",
        }
        # Its workers only supervise rank processes, and their event loop shares the driver
        # process with the ranks' cores. Dask's statistical profiler, a twice-a-second system
        # monitor and 100 ms work stealing (rank tasks are pinned anyway) took about 6% of a
        # core from the ranks; the scheduler's and each worker's 20 ms loop-health tick and
        # the workers' 100 ms memory monitor another 5% (py-spy while 2 ranks train,
        # benchmarks/overhead.py). What is left is mostly the workers' heartbeats, whose
        # interval the scheduler sets (0.5 s up to 10 workers).
        quiet = {
            "distributed.worker.profile.enabled": False,
            "distributed.admin.system-monitor.interval": "5s",
            "distributed.admin.tick.interval": "1s",
            "distributed.worker.memory.monitor-interval": "1s",
            "distributed.scheduler.work-stealing": False,
        }
        with dask.config.set(quiet), LocalCluster(**{**kwargs, **config.cluster_kwargs}) as local:
            yield local
        return
    # No statistical profiler in the workers it starts here either: it calls
    # sys._current_frames() every 10 ms, which on CPython 3.11 before the fix of gh-106883 can
    # deadlock the whole process (a GC inside it holding the runtime lock against the GIL);
    # workers in the driver's process (processes=False) then froze the driver for good. Their
    # threads only supervise rank processes: the profile had nothing to show.
    cluster_class = _import_class(config.cluster_class)
    with (
        dask.config.set({"distributed.worker.profile.enabled": False}),
        cluster_class(**config.cluster_kwargs) as cluster,
    ):
        if config.adapt_kwargs is not None:
            cluster.adapt(**config.adapt_kwargs)
        else:
            cluster.scale(num_workers)
        address = cluster.scheduler_address
        adaptive = config.adapt_kwargs is not None
        DRIVER.remember_cluster(address, StartedCluster(cluster, num_workers, adaptive))
        try:
            yield cluster
        finally:
            DRIVER.forget_cluster(address)


def _import_class(path: str) -> Any:
    """The cluster class at ``path``. Ctrl-C keeps its meaning: importing ``dask_jobqueue``
    replaces the process's SIGINT handler with ``sys.exit()`` (its ``runner`` module does at
    import), which would turn Ctrl-C into a silent exit; the handler is put back."""
    sigint = signal.getsignal(signal.SIGINT)
    try:
        return import_term(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"DaskConfig(cluster_class={path!r}) cannot be imported ({exc}); "
            "give a full import path such as 'dask_jobqueue.SLURMCluster' and install its package."
        ) from exc
    finally:
        if threading.current_thread() is threading.main_thread() and sigint is not None:
            signal.signal(signal.SIGINT, sigint)
