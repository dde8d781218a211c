"""Rank assignment: which Dask worker hosts which rank (plain data, no Dask import)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainlib._internal.common.devices import visible_together
from trainlib.callbacks import RankPlacement


@dataclass(frozen=True)
class WorkerSlot:
    """One Dask worker chosen to host a rank, with the rank's place in the group."""

    address: str
    host: str
    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: str | None = None  # with use_gpu: the worker's CUDA_VISIBLE_DEVICES entry
    # with use_gpu: what the rank sees, its own device among those of the host's other ranks
    visible_devices: tuple[str, ...] = ()
    device_hold: str | None = None  # with use_gpu: the name its rank holds the GPU by on its host

    def placement(self) -> RankPlacement:
        """Where this rank runs, as the callbacks are told."""
        return RankPlacement(
            self.world_rank, self.local_rank, self.node_rank, self.host, self.address, self.device
        )


def assign_ranks(
    workers: list[tuple[str, str]],
    devices: dict[str, str] | None = None,
    scopes: dict[str, object] | None = None,
) -> list[WorkerSlot]:
    """Ranks for ``(host, address)`` pairs: world rank in sorted order, local rank per host.

    ``devices`` gives each worker's GPU (see ``devices.place``). The ranks of one host whose
    workers share a ``scope`` (their devices are numbered alike: the same SLURM job, or none)
    all see each other's devices, each its own at ``RankSpec.device_index``.
    """
    ordered = sorted(workers)
    hosts = sorted({host for host, _ in ordered})
    per_host = {host: [a for h, a in ordered if h == host] for host in hosts}
    slots = [
        WorkerSlot(
            address=address,
            host=host,
            world_rank=world_rank,
            local_rank=per_host[host].index(address),
            local_world_size=len(per_host[host]),
            node_rank=hosts.index(host),
            device=(devices or {}).get(address),
        )
        for world_rank, (host, address) in enumerate(ordered)
    ]
    return [replace(slot, visible_devices=_visible(slot, slots, scopes or {})) for slot in slots]


def _visible(
    slot: WorkerSlot, slots: list[WorkerSlot], scopes: dict[str, object]
) -> tuple[str, ...]:
    if slot.device is None:
        return ()
    scope = scopes.get(slot.address)
    together = visible_together(
        [
            s.device
            for s in slots
            if s.host == slot.host and s.device is not None and scopes.get(s.address) == scope
        ]
    )
    return together or (slot.device,)


def device_index(slot: WorkerSlot) -> int:
    """Where the rank's own device is among those it sees (0 without GPUs)."""
    return slot.visible_devices.index(slot.device) if slot.device is not None else 0
