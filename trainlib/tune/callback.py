"""Search callbacks: observe a search's trials (Ray Tune's ``tune.Callback``).

Pass instances in the Tuner's ``RunConfig(callbacks=[...])``. Ray Tune's hooks are called as
Ray calls them, with keyword arguments (``setup``, ``on_trial_start(iteration, trials,
trial)``, ``on_trial_result``, ``on_trial_save``, ``on_checkpoint``, ``on_trial_complete``,
``on_trial_error``, ``on_experiment_end``), one at a time, each trial the same ``Trial``
object throughout the search. trainlib's own
``on_trial_start(trial)`` and ``on_trial_end(trial)`` are called too (an ``on_trial_start``
whose parameters name ``iteration`` is Ray's). Every callback there is also a
``trainlib.Callback`` of every trial's run (``on_start``, ``on_group_start``, ``on_report``,
``on_group_end``, ``on_end``), called in the trial's own thread, so per-trial state may be
kept in a ``threading.local``. An exception raised in a hook fails that trial.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainlib import callbacks
from trainlib.result import Result

if TYPE_CHECKING:
    from trainlib.checkpoint import Checkpoint

_STATUS = {"running": "RUNNING", "complete": "TERMINATED", "pruned": "TERMINATED"}


@dataclass(eq=False)
class Trial:
    """One trial of a search: one object for its whole life (hashable, as Ray's ``Trial``).

    Attributes:
        number: The trial's number in the study (0, 1, ...).
        name: Its run name, also its directory in the experiment directory.
        config: The config it was given.
        state: ``"running"``, then ``"complete"``, ``"pruned"`` or ``"failed"``.
        result: Its result once it ended (``result.error`` for a failed trial), else None.
        path: Its directory on the search's storage (``{storage_path}/{name}/{trial}``).
        local_path: A local folder for its files (Ray's ``trial.local_path``): ``path``
            itself on local storage; on remote storage a temporary folder uploaded to
            ``path`` when the trial ends.
        last_result: Its latest result as ``on_trial_result`` received it.
    """

    number: int
    name: str
    config: dict[str, Any]
    state: Literal["running", "complete", "pruned", "failed"]
    result: Result | None = None
    path: str = ""
    local_path: str = ""
    last_result: dict[str, Any] = field(default_factory=dict)
    trainable_name: str = ""  # Ray's: the trainable's name (a trial name creator may use it)

    @property
    def trial_id(self) -> str:
        """Ray's ``trial_id``: the trial's name."""
        return self.name

    @property
    def status(self) -> str:
        """Ray's status: ``RUNNING``, ``TERMINATED`` (complete or stopped early) or
        ``ERROR``."""
        return _STATUS.get(self.state, "ERROR")

    @property
    def logdir(self) -> str:
        """Ray's older name of ``local_path``."""
        return self.local_path

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The trial's latest checkpoint once it ended, else None."""
        return self.result.checkpoint if self.result is not None else None

    def __str__(self) -> str:
        return self.name


class Callback(callbacks.Callback):
    """Base class of search callbacks; every method does nothing unless overridden.

    A ``trainlib.Callback`` too: it also sees each trial's run start, reports and end.
    ``iteration`` counts the search's events so far; ``trials`` is every trial started so far.
    """

    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        """Called once when ``fit()`` starts, before any trial."""

    def on_trial_start(self, trial: Trial) -> None:
        """Called when a trial has its workers and its run starts. Ray's signature,
        ``on_trial_start(self, iteration, trials, trial, **info)``, is called as Ray's."""

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        """Called with each result of a trial (its report, Ray's auto-filled fields and
        ``config``)."""

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Called after a trial's checkpoint was committed (before ``on_checkpoint``)."""

    def on_checkpoint(
        self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Checkpoint, **info: Any
    ) -> None:
        """Called after a trial's checkpoint was committed."""

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """Called when a trial ended without an error (complete, or stopped early)."""

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """Called when a trial failed."""

    def on_trial_end(self, trial: Trial) -> None:
        """Called once a trial has ended and its workers are free."""

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Called once when ``fit()`` ends, after every trial."""
