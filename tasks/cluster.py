"""The Dask cluster the pipeline's data tasks run on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import dask
from distributed import Client, LocalCluster
from distributed.utils import import_term

from trainlib import DaskConfig


def dask_config(
    address: str | None, cluster_class: str | None, cluster_kwargs: dict[str, object] | None
) -> DaskConfig:
    """The cluster to use: ``address``, else $DASK_SCHEDULER_ADDRESS (Dask's own setting)
    unless a cluster class is given, else a cluster class, else a LocalCluster."""
    if not address and not cluster_class:
        address = dask.config.get("scheduler-address", None)
    return DaskConfig(
        address=address, cluster_class=cluster_class, cluster_kwargs=dict(cluster_kwargs or {})
    )


@contextmanager
def dask_client(config: DaskConfig, num_workers: int) -> Iterator[Client]:
    """A client of the configured cluster; a cluster started here is closed afterwards."""
    if config.address:
        with Client(config.address) as client:
            yield client
        return
    if config.cluster_class:
        try:
            cluster_class = import_term(config.cluster_class)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"dask_cluster_class={config.cluster_class!r} cannot be imported ({exc}); give "
                "a full import path such as 'dask_jobqueue.SLURMCluster' and install its package."
            ) from exc
        with cluster_class(**config.cluster_kwargs) as cluster:
            if config.adapt_kwargs is not None:
                cluster.adapt(**config.adapt_kwargs)
            else:
                cluster.scale(num_workers)
            with Client(cluster) as client:
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
