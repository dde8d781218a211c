"""The Dask cluster the pipeline's data tasks run on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import dask
from distributed import Client, LocalCluster


def resolve_dask_address(address: str | None) -> str | None:
    """``address``, else Dask's own ``scheduler-address`` setting ($DASK_SCHEDULER_ADDRESS)."""
    return address or dask.config.get("scheduler-address", None)


@contextmanager
def dask_client(address: str | None) -> Iterator[Client]:
    """A client of the cluster at ``address``, or of a LocalCluster started for the block."""
    if address:
        with Client(address) as client:
            yield client
        return
    workers = max(1, min(4, os.cpu_count() or 1))
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client
