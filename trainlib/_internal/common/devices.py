"""GPU assignment: which CUDA device each Dask worker's rank may use (plain data, no Dask or
torch import).

The workers of a host that were given the same devices share them: each gets a *stable
position* among them (sorted by address) and takes the entry at its position. So two groups
that run at once on one host (concurrent search trials, each on its own workers) never share a
device, without the groups knowing of each other:

- One list several workers inherit (a user's ``export CUDA_VISIBLE_DEVICES=0,1`` before a
  LocalCluster; a SLURM GPU job's list inherited by its worker processes): divided between
  them, position ``p`` taking entry ``p``.
- A list of a worker's own (dask-cuda gives every worker a rotation of the host's devices with
  its own first; a job script may give each worker one device): its first entry.
- No list: position ``p`` among the host's workers without one takes device ``p`` of the host.

"The same devices" are the same list in the same SLURM job: SLURM names a job's devices by
the host's numbering (``SLURM_STEP_GPUS`` or ``SLURM_JOB_GPUS``) while ``CUDA_VISIBLE_DEVICES``
may count only what the job's cgroup lets it see (``ConstrainDevices``: every job on a node
sees ``0``). A worker whose position has no device may not host a GPU rank.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

_NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver manages


@dataclass(frozen=True)
class WorkerDevices:
    """What one Dask worker may see of its host's GPUs."""

    address: str
    host: str
    visible: tuple[str, ...] | None  # CUDA_VISIBLE_DEVICES split on commas; None when unset
    device_count: int  # CUDA devices on the host, whatever the worker's list says
    job_gpus: tuple[str, ...] | None = None  # its SLURM job's devices, in the host's numbering

    @property
    def given(self) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        """What tells the devices this worker was given apart from another worker's."""
        return self.visible, self.job_gpus


@dataclass(frozen=True)
class HostShortage:
    """A host whose workers were chosen for more GPU ranks than it has devices for."""

    host: str
    num_devices: int
    num_workers: int


def probe_worker_devices() -> tuple[tuple[str, ...] | None, int, tuple[str, ...] | None]:
    """This process's CUDA_VISIBLE_DEVICES, its host's GPU count and its SLURM job's GPUs (run
    on a Dask worker).

    Reads the NVIDIA driver's list rather than asking torch: a worker never imports torch.
    """
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = None if value is None else parse_visible(value)
    try:
        count = len(os.listdir(_NVIDIA_GPUS_DIR))
    except OSError:
        count = 0
    job = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS")
    return visible, count, None if job is None else parse_visible(job)


def parse_visible(value: str) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as a tuple of entries; an empty value hides every device."""
    return tuple(entry.strip() for entry in value.split(",") if entry.strip())


def assign_devices(workers: Sequence[WorkerDevices]) -> dict[str, str | None]:
    """Each worker's one device (a CUDA_VISIBLE_DEVICES entry), or None if it has none."""
    by_host: dict[str, list[WorkerDevices]] = defaultdict(list)
    for worker in workers:
        by_host[worker.host].append(worker)
    devices: dict[str, str | None] = {}
    for host_workers in by_host.values():
        sharing: dict[object, list[WorkerDevices]] = defaultdict(list)
        for worker in sorted(host_workers, key=lambda w: w.address):
            sharing[worker.given].append(worker)
        for group in sharing.values():
            for position, worker in enumerate(group):
                devices[worker.address] = _device(worker, position)
    return devices


def _device(worker: WorkerDevices, position: int) -> str | None:
    if worker.visible is None:
        return str(position) if position < worker.device_count else None
    return worker.visible[position] if position < len(worker.visible) else None


def shortages(
    workers: Sequence[WorkerDevices], devices: dict[str, str | None]
) -> list[HostShortage]:
    """Hosts where some workers have no device: how many devices and workers each has."""
    by_host: dict[str, list[str]] = defaultdict(list)
    for worker in workers:
        by_host[worker.host].append(worker.address)
    return [
        HostShortage(host, sum(devices[a] is not None for a in addresses), len(addresses))
        for host, addresses in sorted(by_host.items())
        if any(devices[a] is None for a in addresses)
    ]


def duplicate_devices(ranks: Sequence[tuple[int, str, str]]) -> str | None:
    """A message naming ranks that share one physical GPU, from ``(world_rank, host, uuid)``
    of every rank; None when each rank has its own device."""
    holders: dict[tuple[str, str], list[int]] = defaultdict(list)
    for world_rank, host, uuid in ranks:
        holders[(host, uuid)].append(world_rank)
    shared = [(host, uuid, r) for (host, uuid), r in sorted(holders.items()) if len(r) > 1]
    if not shared:
        return None
    host, uuid, sharing = shared[0]
    return (
        f"ranks {', '.join(map(str, sorted(sharing)))} on host {host} were all given GPU "
        f"{uuid}; give each Dask worker on a host its own device (one CUDA_VISIBLE_DEVICES "
        "entry per worker, as dask-cuda does) or start as many workers as the host has GPUs."
    )
