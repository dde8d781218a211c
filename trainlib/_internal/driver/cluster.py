"""The Dask cluster: start a LocalCluster or a cluster class, or connect to one; pick workers.

A cluster class started here (e.g. dask-jobqueue's SLURMCluster) is remembered by its scheduler
address while it runs, so that any wait for workers on it, also through a ``DaskConfig`` that
only has the address (``attached_to``), can replace workers whose jobs ended (a cancelled or
timed-out batch job) and, when it times out, name the jobs still queued and why.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dask
from distributed import Client, LocalCluster
from distributed.utils import import_term

from trainlib._internal.common import devices
from trainlib._internal.driver.batch_jobs import waiting_jobs
from trainlib._internal.driver.ranks import WorkerSlot, assign_ranks
from trainlib._internal.worker.rank_pool import RankPoolPlugin
from trainlib.config import DaskConfig, ScalingConfig
from trainlib.errors import ConfigError, NotEnoughWorkersError

logger = logging.getLogger(__name__)

_WORKER_POLL_S = 0.2
_RESCALE_EVERY_S = 1.0


@dataclass(frozen=True)
class _StartedCluster:
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


_started_lock = threading.Lock()
_started: dict[str, _StartedCluster] = {}  # scheduler address -> a cluster started here


def _started_cluster(client: Client) -> _StartedCluster | None:
    with _started_lock:
        return _started.get(_scheduler(client).address)


@contextmanager
def connect(
    config: DaskConfig,
    num_workers: int,
    client: Client | None = None,
    wait: bool = False,
    warm_ranks: bool = False,
) -> Iterator[Client]:
    """Yield a client of the cluster to use; clusters started here are closed afterwards.

    A cluster started here gets ``num_workers`` workers: a LocalCluster is made with that
    many, a cluster class is scaled to it (unless ``adapt_kwargs`` makes it adaptive). With
    ``wait``, the client is yielded once the cluster has ``num_workers`` workers. With
    ``warm_ranks``, every worker starts its idle rank process now (see ``rank_pool``).

    Raises:
        NotEnoughWorkersError: With ``wait``: fewer workers after ``config.worker_timeout_s``.
    """
    with _client(config, num_workers, client) as connected:
        if warm_ranks:
            connected.register_plugin(RankPoolPlugin())
        if wait:
            select_workers(
                connected, ScalingConfig(num_workers=num_workers), config.worker_timeout_s
            )
        yield connected


@contextmanager
def _client(config: DaskConfig, num_workers: int, client: Client | None) -> Iterator[Client]:
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
def _start_cluster(config: DaskConfig, num_workers: int) -> Iterator[Any]:
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
        # Its workers only supervise rank processes: Dask's statistical profiler, a
        # twice-a-second system monitor, 1 s heartbeats and 100 ms work stealing (rank tasks
        # are pinned anyway) took about 6% of a core from the ranks (py-spy on
        # benchmarks/overhead.py).
        kwargs["heartbeat_interval"] = "5s"
        quiet = {
            "distributed.worker.profile.enabled": False,
            "distributed.admin.system-monitor.interval": "5s",
            "distributed.scheduler.work-stealing": False,
        }
        with dask.config.set(quiet), LocalCluster(**{**kwargs, **config.cluster_kwargs}) as local:
            yield local
        return
    with _import_class(config.cluster_class)(**config.cluster_kwargs) as cluster:
        if config.adapt_kwargs is not None:
            cluster.adapt(**config.adapt_kwargs)
        else:
            cluster.scale(num_workers)
        address = cluster.scheduler_address
        with _started_lock:
            _started[address] = _StartedCluster(
                cluster, num_workers, adaptive=config.adapt_kwargs is not None
            )
        try:
            yield cluster
        finally:
            with _started_lock:
                _started.pop(address, None)


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


def select_workers(
    client: Client,
    scaling: ScalingConfig,
    timeout_s: float,
    exclude: frozenset[str] = frozenset(),
    poll: Callable[[], None] = lambda: None,
    allowed: Callable[[list[str]], Collection[str]] | None = None,
) -> list[WorkerSlot]:
    """Wait for enough eligible workers and assign ranks: sorted by host, then address.

    Workers in ``exclude`` (unresponsive in an earlier attempt) are not eligible. ``allowed``,
    if given, narrows the eligible addresses each time they are looked at (a Tuner trial's
    ``WorkerLease``: only the workers it holds). ``poll`` is called while waiting; it may
    raise to stop the wait (Ctrl-C). On a cluster class that ``connect`` started, lost workers
    are replaced while waiting (once a second). With ``use_gpu``, only workers that have a
    device of their own are eligible (see ``devices``).

    Raises:
        NotEnoughWorkersError: Fewer eligible workers than ``num_workers`` after ``timeout_s``;
            on a job-queue cluster it names the jobs still waiting and, for SLURM, why. With
            ``use_gpu``, at once when enough workers are there but too few have a GPU.
    """
    started = _started_cluster(client)
    deadline = time.monotonic() + timeout_s
    next_rescale = time.monotonic()
    while True:
        found = [
            (host, address)
            for host, address in _eligible_workers(client, scaling.resources_per_worker)
            if address not in exclude
        ]
        gpus = _worker_gpus(client) if scaling.use_gpu else None
        eligible = found if gpus is None else [w for w in found if gpus.devices[w[1]]]
        if allowed is not None:
            permitted = allowed([address for _, address in eligible])
            eligible = [(host, address) for host, address in eligible if address in permitted]
        low, high = scaling.worker_range
        if len(eligible) >= low:
            return assign_ranks(eligible[:high], gpus.devices if gpus else None)
        if gpus is not None and len(found) >= low and allowed is None:
            raise _gpu_shortage(client, scaling, eligible, gpus, timeout_s)
        if time.monotonic() >= deadline:
            waiting = ""
            if started is not None:
                names = [info.get("name", "") for info in _workers(client).values()]
                waiting = waiting_jobs(started.cluster, names)
            raise NotEnoughWorkersError(
                requested=low,
                num_workers=str(scaling.num_workers),
                available=len(eligible),
                address=_scheduler(client).address,
                timeout_s=timeout_s,
                resources=str(dict(scaling.resources_per_worker))
                if scaling.resources_per_worker
                else "",
                waiting_for=waiting,
            )
        if started is not None and time.monotonic() >= next_rescale:
            started.replace_lost_workers()
            next_rescale = time.monotonic() + _RESCALE_EVERY_S
        poll()
        time.sleep(_WORKER_POLL_S)


def eligible_workers(
    client: Client, resources: Mapping[str, float] | None, use_gpu: bool = False
) -> list[str]:
    """Addresses of the workers that have ``resources`` (and a GPU of their own) now."""
    found = [address for _, address in _eligible_workers(client, resources)]
    if not use_gpu:
        return found
    gpus = _worker_gpus(client)
    return [address for address in found if gpus.devices[address]]


@dataclass(frozen=True)
class _WorkerGpus:
    workers: list[devices.WorkerDevices]
    devices: dict[str, str | None]


def _worker_gpus(client: Client) -> _WorkerGpus:
    """Each worker's device, from what every worker sees (asked of the workers at once)."""
    hosts = {address: info["host"] for address, info in _workers(client).items()}
    probed = client.run(devices.probe_worker_devices, workers=list(hosts), on_error="return")
    views = [
        devices.WorkerDevices(address, hosts[address], view[0], view[1])
        for address, view in probed.items()
        if address in hosts and isinstance(view, tuple)
    ]
    assigned = devices.assign_devices(views)
    return _WorkerGpus(views, {a: assigned.get(a) for a in hosts})


def _gpu_shortage(
    client: Client,
    scaling: ScalingConfig,
    eligible: list[tuple[str, str]],
    gpus: _WorkerGpus,
    timeout_s: float,
) -> NotEnoughWorkersError:
    short = devices.shortages(gpus.workers, gpus.devices)
    reason = "; ".join(
        f"host {s.host} has {s.num_devices} CUDA device(s) for its {s.num_workers} Dask workers"
        for s in short
    )
    return NotEnoughWorkersError(
        requested=scaling.worker_range[0],
        num_workers=str(scaling.num_workers),
        available=len(eligible),
        address=_scheduler(client).address,
        timeout_s=timeout_s,
        gpu_shortage=reason or "no worker sees a CUDA device",
    )


def live_workers(client: Client) -> set[str]:
    """Addresses of the workers the scheduler knows now."""
    return set(_workers(client))


def _eligible_workers(
    client: Client, resources: Mapping[str, float] | None
) -> list[tuple[str, str]]:
    workers = _workers(client)
    found = [
        (info["host"], address)
        for address, info in workers.items()
        if all(info.get("resources", {}).get(k, 0) >= v for k, v in (resources or {}).items())
    ]
    return sorted(found)


def _workers(client: Client) -> dict[str, Any]:
    """The scheduler's workers now, asked directly.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which Dask's
    periodic refresh replaces with a worker-less one (``n_workers=0``) every 2 s; read right
    after such a refresh, every rank's worker seemed to have left the cluster.
    """
    identity: dict[str, Any] = client.sync(_scheduler(client).identity, n_workers=-1)
    workers: dict[str, Any] = identity["workers"]
    return workers


def _scheduler(client: Client) -> Any:
    """The connected client's scheduler RPC handle."""
    scheduler = client.scheduler
    assert scheduler is not None, "a connected client has a scheduler"
    return scheduler
