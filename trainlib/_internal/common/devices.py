"""Device placement: which CUDA device each Dask worker's rank may use, and how many cores a
process may run on (plain data, no Dask or torch import).

Each worker has a *pool*: the entries of its CUDA_VISIBLE_DEVICES (up to the first invalid
one, as CUDA reads it), or every GPU of its host when it has no list. The workers of a host
that were given the same devices share them; the one each is offered first is the entry at
its *position* among them (sorted by address):

- One list several workers inherit (a user's ``export CUDA_VISIBLE_DEVICES=0,1`` before a
  LocalCluster; a SLURM GPU job's list inherited by its worker processes): divided between
  them, position ``p`` taking entry ``p``.
- A list of a worker's own (dask-cuda gives every worker a rotation of the host's devices with
  its own first; a job script may give each worker one device): its first entry.
- No list: position ``p`` among the host's workers without one takes device ``p`` of the host.

Positions shift when a worker joins or restarts, so they are only a preference: what keeps two
runs off one GPU is the claim each run takes on a device's physical name (``device_key``)
before a rank is placed on it (``driver/gpu_claims.py``); a worker whose preferred device
is claimed is offered the rest of its pool.

A device's physical name is its UUID where the worker could read them (``gpu_discovery.py``):
an index of the worker's list is the UUID at that place of the devices it may use, in PCI bus
order; a UUID or a prefix of one is the UUID. Without UUIDs, the host's numbering: SLURM names
a job's devices by it (``SLURM_STEP_GPUS`` or ``SLURM_JOB_GPUS``) while ``CUDA_VISIBLE_DEVICES``
may count only what the job's cgroup lets it see (``ConstrainDevices``: every job on a node
sees ``0``), which ``device_key`` translates back. "The same devices" are the same list in the
same SLURM job.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerDevices:
    """What one Dask worker may see of its host's GPUs."""

    address: str
    host: str
    visible: tuple[str, ...] | None  # CUDA_VISIBLE_DEVICES split on commas; None when unset
    device_count: int  # CUDA devices on the host, whatever the worker's list says
    job_gpus: tuple[str, ...] | None = None  # its SLURM job's devices, in the host's numbering
    uuids: tuple[str, ...] | None = None  # the devices it may use, in PCI order (MIG devices)
    held: tuple[tuple[str, str], ...] = ()  # devices a rank on the host holds, and by whom
    parents: tuple[tuple[str, str], ...] = ()  # each MIG device's GPU (its UUID)
    others: tuple[tuple[str, str], ...] = ()  # devices other processes use, and why (gpu_users)

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


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a SLURM job's or a container's
    cpuset), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pinned_to_own_cores() -> bool:
    """Whether this process runs on fewer cores than its parent: a worker pinned to its own
    cores (dask-cuda pins each worker to the cores near its GPU), whose cores are then its
    rank's alone rather than shared by its host's ranks. A SLURM job's or a container's
    cpuset narrows the parent too: not pinned."""
    try:
        return os.sched_getaffinity(0) < os.sched_getaffinity(os.getppid())
    except (AttributeError, OSError):  # not Linux; the parent gone
        return False


def parse_visible(value: str) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: the entries up to the first invalid one.

    An entry is a device index or a ``GPU-``/``MIG-`` UUID; CUDA ignores everything from the
    first other entry on, so ``-1``, ``NoDevFiles`` (what some batch systems set on a job
    without GPUs) and an empty value hide every device.
    """
    entries = []
    for entry in (part.strip() for part in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return tuple(entries)


def pool(worker: WorkerDevices) -> tuple[str, ...]:
    """The CUDA_VISIBLE_DEVICES entries this worker's rank could be given (none on a host
    without GPUs, whatever the worker's list says)."""
    if worker.device_count == 0:
        return ()
    if worker.visible is None:
        if any(u.startswith("MIG-") for u in worker.uuids or ()):
            return worker.uuids or ()  # CUDA takes MIG devices by UUID only
        return tuple(str(index) for index in range(worker.device_count))
    return worker.visible


def device_key(worker: WorkerDevices, entry: str) -> str:
    """The physical GPU behind ``entry`` of ``worker``'s list, named the same by every worker
    of its host however it names it: ``host/uuid``, else ``host/index`` in the host's
    numbering."""
    uuid = _uuid_of(worker, entry)
    if uuid is not None:
        return f"{worker.host}/{uuid}"
    physical, jobs, visible = entry, worker.job_gpus, worker.visible
    # a cgroup counting from 0 lists other devices than its job's (a rotation lists the same)
    renumbered = jobs is not None and (visible is None or set(visible) != set(jobs))
    if renumbered and entry.isdigit() and jobs is not None and int(entry) < len(jobs):
        physical = jobs[int(entry)]
    return f"{worker.host}/{physical}"


def hold_name(key: str) -> str:
    """The name a rank holds its device by on its host (``device_holds``): the key without
    the host."""
    return key.split("/", 1)[1]


def _uuid_of(worker: WorkerDevices, entry: str) -> str | None:
    """The UUID ``entry`` names: itself or the one it is a unique prefix of; by index, the GPU
    at that place of the worker's (a GPU in MIG mode counts once, as the GPU: CUDA numbers GPUs,
    not their slices; None where the worker's UUIDs are unknown)."""
    known = worker.uuids or ()
    if entry.startswith(("GPU-", "MIG-")):
        matches = [u for u in known if u.startswith(entry)]
        return matches[0] if len(matches) == 1 else entry
    parents = dict(worker.parents)
    gpus = tuple(dict.fromkeys(parents.get(uuid, uuid) for uuid in known))
    if entry.isdigit() and int(entry) < len(gpus):
        return gpus[int(entry)]
    return None


def candidates(workers: Iterable[WorkerDevices]) -> dict[str, tuple[str, ...]]:
    """Each worker's devices in the order to try them: its stable position's device first
    (see the module's docstring), then the rest of its list."""
    preferred = _by_position(workers)
    return {
        w.address: tuple(dict.fromkeys([*filter(None, [preferred[w.address]]), *pool(w)]))
        for w in workers
    }


def place(
    workers: Sequence[WorkerDevices],
    wanted: int,
    take: Callable[[str], bool] = lambda key: True,
    among: Sequence[WorkerDevices] = (),
) -> dict[str, str]:
    """A device for each of up to ``wanted`` workers, tried in the order given.

    Each worker gets the first of its ``candidates`` (positions counted among ``workers`` and
    ``among``: every live worker) whose physical GPU no worker placed before it got (for a MIG
    device: no slice of its GPU either, which NCCL refuses within one group) and
    ``take(device_key)`` accepts (another run's claim refuses) and no rank on its host holds
    (``WorkerDevices.held``: a run of another scheduler) and no other process uses
    (``WorkerDevices.others``). Workers without one are left out.
    """
    order = candidates({w.address: w for w in [*among, *workers]}.values())
    placed: dict[str, str] = {}
    used: set[str] = set()
    for worker in workers:
        if len(placed) >= wanted:
            break
        held = {name for name, _ in (*worker.held, *worker.others)}
        parents = dict(worker.parents)
        for entry in order[worker.address]:
            key = device_key(worker, entry)
            gpu = parents.get(hold_name(key))
            sibling = f"{worker.host}/{gpu}" if gpu is not None else None
            if key in used or sibling in used or hold_name(key) in held or not take(key):
                continue
            used.update(filter(None, (key, sibling)))
            placed[worker.address] = entry
            break
    return placed


def assign_devices(workers: Sequence[WorkerDevices]) -> dict[str, str | None]:
    """Each worker's device when every worker hosts a rank, or None if it has none."""
    placed = place(sorted(workers, key=lambda w: (w.host, w.address)), len(workers))
    return {w.address: placed.get(w.address) for w in workers}


def _by_position(workers: Iterable[WorkerDevices]) -> dict[str, str | None]:
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
                entries = pool(worker)
                devices[worker.address] = entries[position] if position < len(entries) else None
    return devices


def shortages(
    workers: Sequence[WorkerDevices], devices: dict[str, str | None]
) -> list[HostShortage]:
    """Hosts where some workers have no device: how many devices and workers each has."""
    by_host: dict[str, list[str]] = defaultdict(list)
    for worker in workers:
        by_host[worker.host].append(worker.address)
    return [
        HostShortage(host, sum(devices.get(a) is not None for a in addresses), len(addresses))
        for host, addresses in sorted(by_host.items())
        if any(devices.get(a) is None for a in addresses)
    ]


def visible_together(entries: Sequence[str]) -> tuple[str, ...]:
    """What the ranks of one run on one host see (NCCL needs to see a peer's GPU to use the
    direct link to it): all their devices, in rank order, when CUDA can read them as one list
    (all indices or all GPU UUIDs, none twice); otherwise nothing shared (each rank sees its
    own: a CUDA process sees one MIG device)."""
    one_form = all(e.isdigit() for e in entries) or not any(e.isdigit() for e in entries)
    mig = any(e.startswith("MIG-") for e in entries)
    if one_form and not mig and len(set(entries)) == len(entries):
        return tuple(entries)
    return ()


def missing_kernels(capability: tuple[int, int], arch_list: Sequence[str]) -> str | None:
    """A message when the installed torch has no kernel for a GPU of ``capability``, from
    ``torch.cuda.get_arch_list()``; None when it has one.

    A cubin built for ``sm_XY`` runs on every ``sm_XZ`` with Z >= Y; PTX built for
    ``compute_XY`` is compiled for any newer GPU when loaded.
    """
    if not arch_list:
        return None
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit():
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and built[0] == major and built[1] <= minor:
            return None
        if kind == "compute" and built <= capability:
            return None
    return (
        f"its GPU has compute capability {major}.{minor} but the installed torch was built for "
        f"{', '.join(arch_list)}: install a torch build for it (a V100 or P100: the CUDA 12.6 "
        "wheels, make TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 on a fresh .venv)"
    )


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
