"""Whether a failed attempt restarts the run, as Ray Train v2's ``FailurePolicy`` decides it:
a decision with its reason and the budget left, from ``FailureConfig``.

A preemption is counted against ``max_preemption_failures`` while it lasts, then as an
ordinary failure against ``max_failures`` (``-1``: unlimited, for either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainlib.config import FailureConfig
from trainlib.errors import RankFailure, WorkerGroupError


@dataclass(frozen=True)
class FailureDecision:
    """What follows a failed attempt.

    Attributes:
        restart: True: a new attempt resumes from the latest checkpoint; False: the run raises
            ``error``.
        counted_as: The budget the failure was counted against.
        count: The failures (or preemptions) counted against that budget so far, this one
            included.
        budget_left: Restarts of that kind still allowed (None: unlimited).
        error: The attempt's failure, its root cause first.
    """

    restart: bool
    counted_as: Literal["failure", "preemption"]
    count: int
    budget_left: int | None
    error: WorkerGroupError

    @property
    def reason(self) -> str:
        """One line: "failure 2: <root cause>"."""
        return f"{self.counted_as} {self.count}: {self.error.root_cause.one_line()}"


class FailurePolicy:
    """A run's failures across its attempts, and the decision after each."""

    def __init__(self, config: FailureConfig) -> None:
        self._config = config
        self.failures: list[RankFailure] = []  # every failed attempt's root cause
        self.preemptions = 0  # of those, the preemptions max_preemption_failures covered

    def record(self, failures: dict[int, RankFailure]) -> WorkerGroupError:
        """Count a failed attempt (its ranks' failures) and return its error."""
        error = WorkerGroupError(failures, num_restarts=len(self.failures))
        self.failures.append(error.root_cause)
        return error

    def decide(self, failures: dict[int, RankFailure]) -> FailureDecision:
        """Count a failed attempt and decide whether the run restarts."""
        error = self.record(failures)
        budget = self._config.max_preemption_failures
        if error.root_cause.kind == "preempted" and (budget == -1 or self.preemptions < budget):
            self.preemptions += 1
            left = None if budget == -1 else budget - self.preemptions
            return FailureDecision(True, "preemption", self.preemptions, left, error)
        counted = len(self.failures) - self.preemptions
        limit = self._config.max_failures
        left = None if limit == -1 else max(limit - counted, 0)
        restart = limit == -1 or counted <= limit
        return FailureDecision(restart, "failure", counted, left, error)
