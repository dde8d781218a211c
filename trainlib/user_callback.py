"""``UserCallback``: Ray Train v2's callback interface (``ray.train.UserCallback``) on trainlib's.

A Ray callback overrides ``after_report(run_context, metrics, checkpoint)`` and
``after_exception(run_context, worker_exceptions)`` and goes in ``RunConfig(callbacks=[...])``
unchanged: ``UserCallback`` is a ``trainlib.Callback`` whose own hooks call those two, in the
process that called ``fit()`` (Ray's controller). What differs:

- ``metrics`` is a list of one dict, rank 0's: trainlib keeps rank 0's metrics only (Ray's
  list has one per worker; ``metrics[0]`` is the same in both).
- ``after_exception`` is called after each attempt that ranks failed, as Ray's (once per
  failed attempt: a restart that recovers still told it), with that attempt's
  ``WorkerGroupError.worker_failures``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainlib.callbacks import Callback, Report, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.errors import WorkerGroupError
from trainlib.result import Result


@dataclass(frozen=True)
class TrainRunContext:
    """The run a ``UserCallback`` hears about (Ray's ``TrainRunContext``, as far as trainlib
    has its parts).

    Attributes:
        run_name: ``RunConfig.name`` (or the generated name): Ray's ``run_config.name``.
        run_path: The run directory on its storage.
        world_size: The number of ranks.
    """

    run_name: str
    run_path: str
    world_size: int

    @property
    def run_id(self) -> str:
        """The run's identity: its name (a run name used again resumes the same run)."""
        return self.run_name


class UserCallback(Callback):
    """Base class of Ray Train v2 callbacks; both methods do nothing unless overridden."""

    _run_context: TrainRunContext | None = None
    _told: WorkerGroupError | None = None  # the last failure after_exception heard

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """Called after each report, once every rank made it and its checkpoint is
        committed: ``metrics`` holds rank 0's metrics, ``checkpoint`` the committed one."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        """Called after each attempt that ranks failed (restarted or not): each failed rank's
        error (a ``trainlib.RankError``) by world rank."""

    def on_start(self, run: RunInfo) -> None:
        self._run_context = TrainRunContext(run.name, run.path, run.world_size)

    def on_report(self, report: Report) -> None:
        self.after_report(self._context(), [dict(report.metrics)], report.checkpoint)

    def on_failure(self, error: WorkerGroupError, restarting: bool) -> None:
        self._told = error
        self.after_exception(self._context(), dict(error.worker_failures))

    def on_end(self, result: Result) -> None:
        error = result.error
        if isinstance(error, WorkerGroupError) and error is not self._told:  # not an attempt's
            self.after_exception(self._context(result), dict(error.worker_failures))

    def _context(self, result: Result | None = None) -> TrainRunContext:
        if self._run_context is None:  # no group formed yet: what the result knows
            path = result.path if result is not None else ""
            return TrainRunContext(path.rstrip("/").rsplit("/", 1)[-1], path, 0)
        return self._run_context
