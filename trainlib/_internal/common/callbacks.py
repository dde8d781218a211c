"""Callbacks: how trackers (MLflow, Prefect) observe a run from the driver.

Subclass ``Callback`` and override what you need; pass instances in
``RunConfig(callbacks=[...])``. Every method runs in the process that called ``fit()``, while
training runs. An exception raised by a callback stops the run and is raised by ``fit()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainlib._internal.common.checkpoint import Checkpoint
from trainlib._internal.common.result import Result


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


class Callback:
    """Base class of run callbacks; every method does nothing unless overridden."""

    def on_start(self, run: RunInfo) -> None:
        """Called once, when the first worker group has formed, before its ranks start.

        Not called when no group forms (e.g. ``NotEnoughWorkersError``); ``on_end`` is.
        """

    def on_report(self, report: Report) -> None:
        """Called for each report, in order, after its checkpoint is committed."""

    def on_end(self, result: Result) -> None:
        """Called once at the end, also after a failure; ``result.error`` is then set."""
