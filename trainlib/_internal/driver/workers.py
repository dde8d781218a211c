"""The Dask workers that host a group's ranks: waiting for enough eligible ones, choosing
them (by resources, GPUs, a trial's lease), and asking the scheduler what it has now."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from distributed import Client

from trainlib._internal.common import devices
from trainlib._internal.common.config import ScalingConfig
from trainlib._internal.driver.batch_jobs import waiting_jobs
from trainlib._internal.driver.ranks import WorkerSlot, assign_ranks
from trainlib._internal.driver.state import DRIVER
from trainlib.errors import NotEnoughWorkersError

_WORKER_POLL_S = 0.2
_RESCALE_EVERY_S = 1.0


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
    started = DRIVER.started_cluster(_scheduler(client).address)
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
        devices.WorkerDevices(address, hosts[address], *view)
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
