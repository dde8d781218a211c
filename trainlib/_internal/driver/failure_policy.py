"""What a failed rank means for the run, as Ray Train v2's ``FailurePolicy`` decides it from
a poll of the worker group (``GroupStatus``): wait (the preemption grace keeps the survivors
on), stop the other ranks, and once every rank ended restart or raise, with the reason and the
budget left, from ``FailureConfig``.

A preemption is counted against ``max_preemption_failures`` while it lasts, then as an
ordinary failure against ``max_failures`` (``-1``: unlimited, for either). A fenced attempt
(the driver was silent past ``DaskConfig.driver_timeout_s``) is never restarted: whatever the
driver held on the cluster may have lapsed meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Literal

from trainlib.config import FailureConfig
from trainlib.errors import RankFailure, WorkerGroupError

if TYPE_CHECKING:
    from trainlib._internal.driver.group_status import GroupStatus
    from trainlib._internal.driver.preemption_grace import PreemptionGrace


class Pending(Enum):
    """A rank failed while others still run: what to do before the decision."""

    WAIT = "the preemption grace keeps the other ranks running"
    STOP = "stop the other ranks, then decide on how every rank ended"


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
        self._grace: PreemptionGrace | None = None
        self._allowance: int | None = None  # restarts left of a live group's call

    def allow_restarts(self, restarts: int) -> None:
        """From now on, restart at most ``restarts`` more times, whatever the failure (a
        preemption too): a live group's call, ``train(max_retries=)``, instead of the
        ``FailureConfig`` budgets."""
        self._allowance = restarts

    def start_attempt(self, grace: PreemptionGrace | None) -> None:
        """A new attempt starts; ``grace`` says how long its survivors of a preemption go on
        (None: a rank's failure stops the others at once)."""
        self._grace = grace

    def decide(self, status: GroupStatus) -> FailureDecision | Pending | None:
        """What a poll of the attempt's ranks means: None while no rank failed; ``Pending``
        until the group was stopped (every rank's end named); then the failed attempt counted
        and the decision to restart or raise."""
        if self._grace is not None and status.retiring:
            self._grace.notice(set(status.retiring))
        if status.healthy:
            return None
        if not status.stopped:
            failed, grace = set(status.failures), self._grace
            waiting = not status.all_ended and failed <= status.retiring  # survivors, preempted
            if waiting and grace is not None and grace.holds(failed):
                return Pending.WAIT
            return Pending.STOP
        return self._count(dict(status.failures))

    def record(self, failures: dict[int, RankFailure]) -> WorkerGroupError:
        """Count a failed attempt (its ranks' failures) and return its error."""
        error = WorkerGroupError(failures, num_restarts=len(self.failures))
        self.failures.append(error.root_cause)
        return error

    def _count(self, failures: dict[int, RankFailure]) -> FailureDecision:
        """Count a failed attempt and decide whether the run restarts."""
        error = self.record(failures)
        counted = len(self.failures) - self.preemptions
        if any(f.kind == "fenced" for f in failures.values()):  # what it held may have lapsed
            return FailureDecision(False, "failure", counted, 0, error)
        if self._allowance is not None:
            restart = self._allowance > 0
            self._allowance = max(self._allowance - 1, 0)
            return FailureDecision(restart, "failure", counted, self._allowance, error)
        budget = self._config.max_preemption_failures
        if error.root_cause.kind == "preempted" and (budget == -1 or self.preemptions < budget):
            self.preemptions += 1
            left = None if budget == -1 else budget - self.preemptions
            return FailureDecision(True, "preemption", self.preemptions, left, error)
        limit = self._config.max_failures
        left = None if limit == -1 else max(limit - counted, 0)
        restart = limit == -1 or counted <= limit
        return FailureDecision(restart, "failure", counted, left, error)
