"""Search callbacks: observe trials as they start and end (Ray Tune's ``tune.Callback``).

Pass instances in the Tuner's ``RunConfig(callbacks=[...])``. Every callback there is also a
``trainlib.Callback`` of every trial's run (``on_start``, ``on_group_start``, ``on_report``,
``on_group_end``, ``on_end``). Every method runs in the process calling ``fit()``, in the
trial's own thread, so per-trial state may be kept in a ``threading.local``; an exception
raised there fails that trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trainlib import callbacks
from trainlib.result import Result


@dataclass(frozen=True)
class Trial:
    """One trial of a search.

    Attributes:
        number: The trial's number in the study (0, 1, ...).
        name: Its run name, also its directory in the experiment directory.
        config: The config it was given.
        state: ``"running"``, then ``"complete"``, ``"pruned"`` or ``"failed"``.
        result: Its result once it ended (``result.error`` for a failed trial), else None.
    """

    number: int
    name: str
    config: dict[str, Any]
    state: Literal["running", "complete", "pruned", "failed"]
    result: Result | None = None


class Callback(callbacks.Callback):
    """Base class of search callbacks; every method does nothing unless overridden.

    A ``trainlib.Callback`` too: it also sees each trial's run start, reports and end.
    """

    def on_trial_start(self, trial: Trial) -> None:
        """Called when a trial has its workers and its run starts."""

    def on_trial_end(self, trial: Trial) -> None:
        """Called once a trial has ended and its workers are free."""
