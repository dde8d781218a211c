"""A run's lifecycle as states, as Ray Train v2's controller draws it (its
``controller/state.py``): initializing -> scheduling -> running -> (resizing | restarting ->
scheduling -> running)* -> finished | errored | aborted.

Each state is a small frozen class with the data it was entered with; the terminal ones say
so (``is_terminal``). ``Lifecycle`` holds a run's current state and logs each transition once,
in the words the log has always had ("Run x restarting after failure 1: ...").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from trainlib._internal.driver.failure_policy import FailureDecision
    from trainlib._internal.driver.scaling_policy import ResizeDecision

logger = logging.getLogger("trainlib._internal.driver.controller")  # the run's log, as before


@dataclass(frozen=True)
class ControllerState:
    """One state of a run. ``describe`` is what the log says on entering it (after "Run
    <name>"), ``level`` how loud."""

    is_terminal: ClassVar[bool] = False
    level: ClassVar[int] = logging.DEBUG

    def describe(self) -> str:
        return type(self).__name__.lower()


@dataclass(frozen=True)
class Initializing(ControllerState):
    """The run is named and its storage opened; nothing is placed yet."""


@dataclass(frozen=True)
class Scheduling(ControllerState):
    """Choosing the workers of the next attempt (waiting for them if the cluster has too
    few)."""

    attempt: int

    def describe(self) -> str:
        return f"scheduling attempt {self.attempt}"


@dataclass(frozen=True)
class Running(ControllerState):
    """An attempt's group of ranks runs the training function."""

    level: ClassVar[int] = logging.INFO
    attempt: int
    ranks: int
    resume_from: str  # a checkpoint, or "scratch"

    def describe(self) -> str:
        return f"starting (attempt {self.attempt}) on {self.ranks} ranks from {self.resume_from}"


@dataclass(frozen=True)
class Resizing(ControllerState):
    """The scaling policy asked for a larger group: the attempt's ranks stop, the next attempt
    resumes from the latest checkpoint."""

    level: ClassVar[int] = logging.INFO
    decision: ResizeDecision

    def describe(self) -> str:
        d = self.decision
        return (
            f"resizing: {d.available} eligible Dask workers for its {d.ranks} ranks (up to "
            f"{d.most}); re-forming the group from the latest checkpoint"
        )


@dataclass(frozen=True)
class Restarting(ControllerState):
    """The failure policy restarts the run after a failed attempt."""

    level: ClassVar[int] = logging.WARNING
    decision: FailureDecision

    def describe(self) -> str:
        return f"restarting after {self.decision.reason}"


@dataclass(frozen=True)
class Finished(ControllerState):
    """Every rank ended well and every checkpoint was validated."""

    is_terminal: ClassVar[bool] = True
    level: ClassVar[int] = logging.INFO

    def describe(self) -> str:
        return "finished"


@dataclass(frozen=True)
class Errored(ControllerState):
    """The run failed: the failure policy raised, or the cluster could not run it."""

    is_terminal: ClassVar[bool] = True
    level: ClassVar[int] = logging.INFO  # the caller reports the error itself
    error: str  # the error's type

    def describe(self) -> str:
        return f"ended with {self.error}"


@dataclass(frozen=True)
class Aborted(ControllerState):
    """Stopped from outside: Ctrl-C, or the search running it as a trial stopped."""

    is_terminal: ClassVar[bool] = True
    level: ClassVar[int] = logging.INFO
    error: str

    def describe(self) -> str:
        return f"ended with {self.error}"


StateListener = Callable[["ControllerState", "ControllerState"], None]  # (previous, current)


class Lifecycle:
    """A run's current state; each transition is logged once and told to every listener
    (the controller callbacks' ``after_controller_state_update``)."""

    def __init__(self, run_name: str) -> None:
        self.run_name = run_name
        self.state: ControllerState = Initializing()
        self.listeners: list[StateListener] = []

    def enter(self, state: ControllerState) -> None:
        """Leave the current state for ``state`` (a terminal state is never left)."""
        if self.state.is_terminal:
            raise RuntimeError(f"Run {self.run_name} already {self.state.describe()}")
        previous, self.state = self.state, state
        logger.log(state.level, "Run %s %s", self.run_name, state.describe())
        for listener in self.listeners:
            listener(previous, state)
