"""What one poll of an attempt's worker group saw (Ray Train v2's ``WorkerGroupPollStatus``):
which ranks ended and how, and which are being preempted. The controller's policies decide on
it (``failure_policy``, ``scaling_policy``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainlib.errors import RankFailure


@dataclass(frozen=True)
class GroupStatus:
    """The ranks of a group of ``size`` as one poll saw them.

    Attributes:
        size: The group's number of ranks.
        ended: The ranks whose process ended (well or not).
        failures: Of those, the ranks that failed, by world rank.
        retiring: The ranks whose Dask worker retires gracefully (a preemption), ended or not.
        stopped: The group was stopped: every rank ended, and the end of a preempted worker's
            rank is named a preemption.
    """

    size: int
    ended: frozenset[int] = frozenset()
    failures: Mapping[int, RankFailure] = field(default_factory=dict)
    retiring: frozenset[int] = frozenset()
    stopped: bool = False

    @property
    def all_ended(self) -> bool:
        """Every rank ended: the attempt is over."""
        return len(self.ended) == self.size

    @property
    def finished(self) -> bool:
        """Every rank ended well."""
        return self.all_ended and not self.failures

    @property
    def healthy(self) -> bool:
        """No rank failed (the ranks may still run)."""
        return not self.failures
