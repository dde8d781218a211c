"""Rank assignment: which Dask worker hosts which rank (plain data, no Dask import)."""

from __future__ import annotations

from dataclasses import dataclass


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


def assign_ranks(
    workers: list[tuple[str, str]], devices: dict[str, str | None] | None = None
) -> list[WorkerSlot]:
    """Ranks for ``(host, address)`` pairs: world rank in sorted order, local rank per host;
    ``devices`` gives each worker's GPU (see ``devices.assign_devices``)."""
    ordered = sorted(workers)
    hosts = sorted({host for host, _ in ordered})
    per_host = {host: [a for h, a in ordered if h == host] for host in hosts}
    return [
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
