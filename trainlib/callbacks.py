"""Callbacks: how code in the driver observes a run, and how trackers record it.

Subclass ``Callback`` and override what you need; pass instances in
``RunConfig(callbacks=[...])``. Every method runs in the process that called ``fit()``. Two kinds:

- A ``Callback`` *decides*: it runs in line with training, and an exception it raises stops the
  run and is raised by ``fit()`` (a stopping rule, a pruner, a check).
- A ``TrackingCallback`` *records* (an experiment tracker, a dashboard): it never stops the run
  and never holds its training. Its records are delivered in order on a thread of their own and
  retried through an outage of its service (see the class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.checkpoint import Checkpoint
from trainlib.result import Result

if TYPE_CHECKING:
    from distributed import Client

    from trainlib.errors import WorkerGroupError


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
        committed: The reports of every checkpoint already in the run directory, oldest
            first (``resumed_from`` is the last): what a tracker that recorded the first
            driver's reports may have missed when it died.
    """

    name: str
    path: str
    world_size: int
    resumed_from: Report | None = None
    committed: tuple[Report, ...] = ()


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

    def on_failure(self, error: WorkerGroupError, restarting: bool) -> None:
        """Called after each attempt that ranks failed, before its group ends: its failures
        (``error.worker_failures``) and whether the run restarts (else it raises ``error``)."""

    def on_end(self, result: Result) -> None:
        """Called once at the end, also after a failure; ``result.error`` is then set."""


class TrackingCallback(Callback):
    """A callback that records the run in a service (MLflow, a dashboard): never a reason for
    the run to stop or wait.

    Its records, ``on_start``, ``on_report`` and ``on_end``, are queued and delivered in order,
    each once, by a thread of its own, so training never waits for the service. A record whose
    delivery raises an error ``is_transient`` calls an outage: it is tried again (after 1 s,
    then doubling up to 30 s), the records after it waiting behind it, until the service
    answers; other errors drop that record with a warning. The run's end waits for the queue
    to empty, but never more than ``outage_tolerance_s`` after the outage began: past that it
    ends with a warning naming ``service`` and the records not delivered (they are retried
    while the process lives). Every outage is logged when it begins, when it passes
    ``outage_tolerance_s`` and when it ends. ``on_group_start`` and ``on_group_end`` are called
    in place (the group's client is open then); an error they raise is logged, never raised.

    A record is retried by calling its method again with the same argument: make them safe to
    repeat (an MLflow metric logged with the same step and timestamp is stored once).

    Attributes:
        service: What the callback records to, named in warnings (e.g. ``"MLflow"``).
        outage_tolerance_s: How long the run's end waits for an outage to pass.
    """

    service: str = "a tracking service"
    outage_tolerance_s: float = 900.0

    def is_transient(self, error: Exception) -> bool:
        """Whether ``error`` means the service is out of reach for now (the record is retried)
        rather than that it refused the record (dropped with a warning). Default: every error
        is an outage."""
        return True
