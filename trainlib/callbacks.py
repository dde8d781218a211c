"""Callbacks: how trackers (MLflow, Prefect) observe a run from the driver.

Subclass ``Callback`` and override what you need; pass instances in
``RunConfig(callbacks=[...])``. Every method runs in the process that called ``fit()``, while
training runs. An exception raised by a callback stops the run and is raised by ``fit()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.checkpoint import Checkpoint
from trainlib.result import Result

if TYPE_CHECKING:
    from distributed import Client


@dataclass(frozen=True)
class Report:
    """One ``report()`` call, complete once every rank has made it.

    Attributes:
        index: The report's number in this run (it names the checkpoint directory).
        metrics: Rank 0's metrics.
        checkpoint: The committed checkpoint, if one was reported.
    """

    index: int
    metrics: dict[str, Any]
    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class RunInfo:
    """The run that is starting.

    Attributes:
        name: The run name (``RunConfig.name``, or the generated one).
        path: The run directory on its storage.
        world_size: The number of ranks of the group that formed (for an elastic
            ``num_workers=(min, max)``, as many as the cluster had, up to ``max``).
        resumed_from: The report of the latest checkpoint already in the run directory (a
            run name used again after the driver died), or None for a new run.
    """

    name: str
    path: str
    world_size: int
    resumed_from: Report | None = None


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank of a group runs.

    Attributes:
        world_rank: The rank's place in the group.
        local_rank: Its place among the ranks on its host.
        node_rank: Its host's place among the group's hosts.
        host: The host, as Dask names it (the worker's address without port).
        worker: The address of the Dask worker that hosts the rank.
        device: Its CUDA device (the worker's ``CUDA_VISIBLE_DEVICES`` entry), or None.
    """

    world_rank: int
    local_rank: int
    node_rank: int
    host: str
    worker: str
    device: str | None = None


@dataclass(frozen=True)
class GroupInfo:
    """A worker group that formed: the first one, or one re-formed after a failure.

    Attributes:
        attempt: 1 for the first group, one more for each restart.
        ranks: Where each rank runs, by world rank.
        client: The Dask client of the run, to ask the group's workers something
            (``client.run(f, workers=[...])``). Valid until ``on_group_end``; do not close it.
            None in local mode (``num_workers=0``: no cluster).
    """

    attempt: int
    ranks: tuple[RankPlacement, ...]
    client: Client | None

    @property
    def hosts(self) -> dict[str, str]:
        """One Dask worker of the group per host: ``{host: worker address}``."""
        found: dict[str, str] = {}
        for placement in self.ranks:
            found.setdefault(placement.host, placement.worker)
        return found


class Callback:
    """Base class of run callbacks; every method does nothing unless overridden."""

    def on_start(self, run: RunInfo) -> None:
        """Called once, when the first worker group has formed, before its ranks start.

        Not called when no group forms (e.g. ``NotEnoughWorkersError``); ``on_end`` is.
        """

    def on_group_start(self, group: GroupInfo) -> None:
        """Called each time a worker group has formed (every attempt), as its ranks start."""

    def on_group_end(self, group: GroupInfo) -> None:
        """Called when that group ends (finished, failed or interrupted), before its ranks are
        stopped, while the Dask client is still open."""

    def on_report(self, report: Report) -> None:
        """Called for each report, in order, after its checkpoint is committed."""

    def on_end(self, result: Result) -> None:
        """Called once at the end, also after a failure; ``result.error`` is then set."""
