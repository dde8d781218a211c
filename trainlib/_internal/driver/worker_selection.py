"""The Dask workers that host a group's ranks: waiting for enough eligible ones, choosing
them (by resources, free GPUs, a trial's share of the workers), and asking the scheduler
what it has now."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from distributed import Client

from trainlib._internal.common import device_holds, devices, gpu_discovery, gpu_users, scheduler_rpc
from trainlib._internal.common.scheduler_rpc import scheduler_address
from trainlib._internal.driver.batch_jobs import waiting_jobs
from trainlib._internal.driver.gpu_claims import GpuClaims
from trainlib._internal.driver.process_globals import DRIVER
from trainlib._internal.driver.ranks import WorkerSlot, assign_ranks
from trainlib.config import ScalingConfig
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
    claims: GpuClaims | None = None,
) -> list[WorkerSlot]:
    """Wait for enough eligible workers and assign ranks: sorted by host, then address.

    Workers in ``exclude`` (unresponsive in an earlier attempt) are not eligible. ``allowed``,
    if given, narrows the eligible addresses each time they are looked at (a Tuner trial's
    ``WorkerLease``: only the workers it holds). ``poll`` is called while waiting; it may
    raise to stop the wait (Ctrl-C). On a cluster class that ``connect`` started, lost workers
    are replaced while waiting (once a second). With ``use_gpu``, only workers that can be
    given a device are eligible (see ``devices``), and each chosen worker's device is claimed
    in ``claims`` (the run's: kept across its attempts until it ends), all or nothing.

    Raises:
        NotEnoughWorkersError: Fewer eligible workers than ``num_workers`` after ``timeout_s``;
            on a job-queue cluster it names the jobs still waiting and, for SLURM, why. With
            ``use_gpu`` and no ``allowed``, at once when enough workers are there but too few
            have a GPU, or too few of their GPUs are free (naming the runs holding them).
    """
    started = DRIVER.started_cluster(scheduler_address(client))
    deadline = time.monotonic() + timeout_s
    next_rescale = time.monotonic()
    low, high = scaling.worker_range
    while True:
        live = _workers(client)  # one read: the addresses, hosts and devices agree
        found = [
            (host, address)
            for host, address in _eligible_workers(live, scaling.resources_per_worker)
            if address not in exclude
        ]
        gpus = _worker_gpus(client, live) if scaling.use_gpu else None
        eligible = found if gpus is None else [w for w in found if gpus.has_device(w[1])]
        if allowed is not None:
            permitted = allowed([address for _, address in eligible])
            eligible = [(host, address) for host, address in eligible if address in permitted]
        available = len(eligible)
        if gpus is None:
            if available >= low:
                return assign_ranks(eligible[:high])
        else:
            placed = gpus.place([address for _, address in eligible], high, low, claims)
            chosen = [(host, address) for host, address in eligible if address in (placed or {})]
            available = len(chosen)
            if placed is not None and available >= low:
                slots = assign_ranks(chosen, placed, gpus.scopes)
                return [replace(s, device_hold=gpus.hold_name(s)) for s in slots]
            placing = placed is None  # another run was placing: ask again, not a verdict
            if not placing and allowed is None and claims is not None and claims.refused:
                raise _gpus_in_use(client, scaling, available, claims.refused, timeout_s)
            if not placing and allowed is None and len(found) >= low:
                raise _gpu_shortage(client, scaling, available, gpus, found, timeout_s)
        if time.monotonic() >= deadline:
            if claims is not None and claims.refused:  # a trial waited for GPUs in use
                raise _gpus_in_use(client, scaling, available, claims.refused, timeout_s)
            waiting = ""
            if started is not None:
                names = [info.get("name", "") for info in live.values()]
                waiting = waiting_jobs(started.cluster, names)
            raise NotEnoughWorkersError(
                requested=low,
                num_workers=str(scaling.num_workers),
                available=available,
                address=scheduler_address(client),
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
        # jittered: runs waiting for the same GPUs do not all ask again at the same moment
        time.sleep(_WORKER_POLL_S * random.uniform(0.5, 1.5))


def gpu_shortage(
    client: Client, scaling: ScalingConfig, available: int, timeout_s: float
) -> NotEnoughWorkersError | None:
    """For a search that waited ``timeout_s`` for workers with a GPU: when it has the workers
    but too few of them have a GPU, the error naming the hosts with too few devices; None
    when workers are missing."""
    live = _workers(client)
    found = _eligible_workers(live, scaling.resources_per_worker)
    if len(found) < scaling.worker_range[0]:
        return None
    return _gpu_shortage(client, scaling, available, _worker_gpus(client, live), found, timeout_s)


def eligible_workers(
    client: Client, resources: Mapping[str, float] | None, use_gpu: bool = False
) -> list[str]:
    """Addresses of the workers that have ``resources`` (and a GPU to offer) now."""
    live = _workers(client)
    found = [address for _, address in _eligible_workers(live, resources)]
    if not use_gpu:
        return found
    gpus = _worker_gpus(client, live)
    return [address for address in found if gpus.has_device(address)]


@dataclass(frozen=True)
class _WorkerGpus:
    """What each live worker sees of its host's GPUs (workers that did not answer: nothing)."""

    views: dict[str, devices.WorkerDevices]

    def has_device(self, address: str) -> bool:
        view = self.views.get(address)
        return view is not None and bool(devices.pool(view))

    def hold_name(self, slot: WorkerSlot) -> str | None:
        """The name the slot's rank holds its GPU by on its host (``device_holds``)."""
        if slot.device is None:
            return None
        return devices.hold_name(devices.device_key(self.views[slot.address], slot.device))

    @property
    def scopes(self) -> dict[str, object]:
        """Workers whose devices are numbered alike (the same SLURM job, or none)."""
        return {address: view.job_gpus for address, view in self.views.items()}

    def place(
        self, addresses: list[str], wanted: int, least: int, claims: GpuClaims | None
    ) -> dict[str, str] | None:
        """Devices for up to ``wanted`` of ``addresses``, each claimed in ``claims`` if given,
        all or nothing: with fewer than ``least`` placed, no claim is kept (two runs waiting
        for the same GPUs never hold part of them each; the devices it could have had are
        still returned, for the caller's message); else those not used are released.
        None when another run of the scheduler was placing all along (ask again)."""
        views = [self.views[a] for a in addresses]
        every = list(self.views.values())
        if claims is None:
            return devices.place(views, wanted, among=every)
        with claims.placing() as placing:
            if not placing:
                return None
            for view in views:  # held by a rank another scheduler started: said if it fails
                for name, who in view.held:
                    where = f"{view.host}/{name}"
                    claims.refused[where] = f"{who} on {view.host} (its rank holds it)"
                for name, why in view.others:  # used by a process trainlib did not start
                    claims.refused[f"{view.host}/{name}"] = f"{why} (on {view.host})"
            placed = devices.place(views, wanted, claims.take, among=every)
            kept = placed if len(placed) >= least else {}
            claims.keep({devices.device_key(self.views[a], e) for a, e in kept.items()})
            return placed


def _worker_gpus(client: Client, live: dict[str, Any]) -> _WorkerGpus:
    """Each live worker's view of its GPUs (asked of the workers at once; a worker that left
    since ``live`` was read has none)."""
    hosts = {address: info["host"] for address, info in live.items()}
    probed = client.run(gpu_discovery.probe_worker_devices, workers=list(hosts), on_error="return")
    for view in probed.values():
        # a host's setting that is wrong: said at once, not a worker silently passed over
        if isinstance(view, (device_holds.LockFolderError, gpu_users.OthersSettingError)):
            raise view
    return _WorkerGpus(
        {
            address: devices.WorkerDevices(address, hosts[address], *view)
            for address, view in probed.items()
            if address in hosts and isinstance(view, tuple)
        }
    )


def _gpu_shortage(
    client: Client,
    scaling: ScalingConfig,
    available: int,
    gpus: _WorkerGpus,
    found: list[tuple[str, str]],
    timeout_s: float,
) -> NotEnoughWorkersError:
    views = [gpus.views[a] for _, a in found if a in gpus.views]
    short = devices.shortages(views, devices.assign_devices(views))
    reason = "; ".join(
        f"host {s.host} has {s.num_devices} CUDA device(s) for its {s.num_workers} Dask workers"
        for s in short
    )
    return _gpu_error(
        client, scaling, available, timeout_s, gpu_shortage=reason or "no worker sees a CUDA device"
    )


def _gpus_in_use(
    client: Client,
    scaling: ScalingConfig,
    available: int,
    refused: dict[str, str],
    timeout_s: float,
) -> NotEnoughWorkersError:
    holders = "; ".join(f"GPU {key} is used by {who}" for key, who in sorted(refused.items()))
    return _gpu_error(client, scaling, available, timeout_s, gpus_in_use=holders)


def _gpu_error(
    client: Client, scaling: ScalingConfig, available: int, timeout_s: float, **reason: str
) -> NotEnoughWorkersError:
    """Too few GPUs for ``scaling``, for ``reason`` (``gpu_shortage=`` or ``gpus_in_use=``)."""
    return NotEnoughWorkersError(
        requested=scaling.worker_range[0],
        num_workers=str(scaling.num_workers),
        available=available,
        address=scheduler_address(client),
        timeout_s=timeout_s,
        **reason,
    )


def shortage(client: Client, needs: ScalingConfig, timeout_s: float) -> NotEnoughWorkersError:
    """Why ``needs`` cannot be placed now: too few GPUs for it, else too few eligible
    workers."""
    live = eligible_workers(client, needs.resources_per_worker, needs.use_gpu)
    if needs.use_gpu and (gpus := gpu_shortage(client, needs, len(live), timeout_s)) is not None:
        return gpus
    size, resources = needs.worker_range[1], needs.resources_per_worker
    return NotEnoughWorkersError(
        requested=size,
        num_workers=str(size),
        available=len(live),
        address=scheduler_address(client),
        timeout_s=timeout_s,
        resources=str(dict(resources)) if resources else "",
    )


def worker_statuses(client: Client) -> dict[str, str]:
    """The scheduler's workers now and their status (``running``, ``closing_gracefully``: a
    worker that is retiring, ...)."""
    return {address: str(info.get("status", "")) for address, info in _workers(client).items()}


def retired_gracefully(client: Client, address: str) -> bool:
    """Whether the worker at ``address`` began to retire (``retire_workers``,
    ``close_gracefully``, ``--lifetime``), by the scheduler's log of it: its status changed to
    ``closing_gracefully``, or its removal was expected. A worker that died has neither."""
    for _, message in client.get_events(address):
        if not isinstance(message, dict):
            continue
        action = message.get("action")
        if action == "worker-status-change" and message.get("status") == "closing_gracefully":
            return True
        if action == "retired" or (action == "remove-worker" and message.get("expected")):
            return True
    return False


def _eligible_workers(
    workers: dict[str, Any], resources: Mapping[str, float] | None
) -> list[tuple[str, str]]:
    found = [
        (info["host"], address)
        for address, info in workers.items()
        if all(info.get("resources", {}).get(k, 0) >= v for k, v in (resources or {}).items())
    ]
    return sorted(found)


def _workers(client: Client) -> dict[str, Any]:
    """The scheduler's workers now, asked directly (``scheduler_rpc.workers``)."""
    return scheduler_rpc.workers(client)
