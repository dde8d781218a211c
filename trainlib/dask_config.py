"""DaskConfig: which Dask cluster runs the ranks, and the one way to open it (ours; Ray's
counterpart is the Ray cluster ``ray.init`` connects to)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from distributed import Client


@dataclass(frozen=True, kw_only=True)
class DaskConfig:
    """Which Dask cluster runs the ranks.

    With neither ``address`` nor ``cluster_class``: the scheduler in Dask's own
    ``scheduler-address`` setting ($DASK_SCHEDULER_ADDRESS) if there is one, else a
    ``distributed.LocalCluster`` on 127.0.0.1 with one single-threaded worker per rank, running
    as threads of the calling process (each rank is still a process of its own), closed
    afterwards; ``cluster_kwargs`` override its arguments (e.g. ``{"processes": True}``).
    Follows prefect-dask's conventions.

    Args:
        address: Scheduler address of an existing cluster, e.g. ``"tcp://10.0.0.5:8786"``.
        cluster_class: Import path of a cluster class, e.g. ``"dask_jobqueue.SLURMCluster"``;
            started with ``cluster_kwargs`` and closed by ``fit()``.
        cluster_kwargs: Keyword arguments for the cluster class (or the LocalCluster).
        adapt_kwargs: If set, ``cluster.adapt(**adapt_kwargs)``; otherwise the started
            cluster is scaled to ``num_workers``.
        worker_timeout_s: How long to wait for enough workers before raising
            ``NotEnoughWorkersError``.
        driver_timeout_s: Ranks stop themselves once they have not heard from this process
            (the driver) for this long: a driver frozen, paused or cut off from the scheduler
            keeps its ranks' tasks, and anything it holds on the cluster by a lease (a
            ``distributed.Semaphore``) lapses after that lease's timeout while they train on.
            Set it below that timeout; the run then fails (``RankFailure.kind`` ``fenced``,
            never restarted by the same driver) and resumes when run again. None: ranks stop
            only when the driver's client leaves.
    """

    address: str | None = None
    cluster_class: str | None = None
    cluster_kwargs: Mapping[str, Any] = field(default_factory=dict)
    adapt_kwargs: Mapping[str, Any] | None = None
    worker_timeout_s: float = 60.0
    driver_timeout_s: float | None = None

    def connect(
        self, num_workers: int = 1, *, wait: bool = False, warm_ranks: bool = False
    ) -> AbstractContextManager[Client]:
        """A client of this cluster, as a context manager; a cluster it starts is closed on exit.

        The one way the pipeline and ``fit()`` get a cluster: a LocalCluster or a cluster
        class is started with ``num_workers`` workers (a cluster class with ``adapt_kwargs``
        adapts instead); with ``address``, the existing cluster is used as it is. With
        ``wait``, the client comes once the cluster has ``num_workers`` workers, or
        ``NotEnoughWorkersError`` after ``worker_timeout_s`` (fail before any work is done).
        With ``warm_ranks``, each worker starts its fork server now (torch imported while the
        caller prepares), so even the first ``fit()`` on this cluster starts its ranks at once;
        without it the first ``fit()`` starts them, and later fits are warm either way.

        Example:
            >>> with DaskConfig().connect(num_workers=2) as client:
            ...     client.submit(sum, [1, 2]).result()
        """
        from trainlib._internal.driver.cluster import connect

        if num_workers < 1:
            raise ConfigError(f"DaskConfig.connect(num_workers={num_workers}) must be >= 1.")
        return connect(self, num_workers, wait=wait, warm_ranks=warm_ranks)

    def attached_to(self, client: Client) -> DaskConfig:
        """This config pointing at the running cluster of ``client`` (by scheduler address):
        what to hand to code that should use the cluster without starting one."""
        from trainlib._internal.common.scheduler_rpc import scheduler_address

        try:
            address = scheduler_address(client)
        except RuntimeError:
            raise ConfigError("DaskConfig.attached_to() needs a connected client.") from None
        return replace(
            self,
            address=address,
            cluster_class=None,
            cluster_kwargs={},
            adapt_kwargs=None,
        )

    def __post_init__(self) -> None:
        if self.address and self.cluster_class:
            raise ConfigError(
                "DaskConfig takes address or cluster_class, not both; drop one of them."
            )
        if self.driver_timeout_s is not None and not self.driver_timeout_s >= 2:
            raise ConfigError(
                f"DaskConfig(driver_timeout_s={self.driver_timeout_s}) must be 2 s or more "
                "(the driver beats every quarter of it), or None."
            )
        if self.worker_timeout_s <= 0:
            raise ConfigError(
                f"DaskConfig(worker_timeout_s={self.worker_timeout_s}) must be positive."
            )
