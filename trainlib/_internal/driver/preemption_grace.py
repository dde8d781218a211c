"""What an attempt does while some of its ranks are preempted, as Ray Train's
``FailureConfig(relax_collectives_on_preemption=, preemption_grace_s=)`` says.

Relaxed, a report is complete once the surviving ranks made it (rank 0 must be one of them:
its metrics are the report's), so the survivors can commit a just-in-time checkpoint on their
own; a sharded checkpoint then lacks the preempted ranks' shards. With a grace, the survivors
keep running after the preempted ranks ended, until they commit a checkpoint or the grace runs
out; then the attempt ends as preempted and the run restarts from its latest checkpoint. Dask
gives no deadline, so the grace counts from the end of the first preempted rank.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainlib._internal.driver.checkpoint_manager import CheckpointManager
    from trainlib._internal.driver.report_collector import ReportCollector
    from trainlib.config import FailureConfig

logger = logging.getLogger(__name__)


class PreemptionGrace:
    """One attempt's handling of preempted ranks."""

    def __init__(
        self,
        config: FailureConfig,
        collector: ReportCollector,
        manager: CheckpointManager,
        world_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._relax = config.relax_collectives_on_preemption
        self._grace_s = config.preemption_grace_s
        self._collector = collector
        self._manager = manager
        self._world = set(range(world_size))
        self._preempted: set[int] = set()
        self._latest_at_notice: int | None = None
        self._ends_at: float | None = None

    def notice(self, preempted: set[int]) -> None:
        """The workers of these ranks are retiring: relax the reports to the others."""
        if preempted <= self._preempted:
            return
        if self._latest_at_notice is None:
            latest = self._manager.latest
            self._latest_at_notice = latest.index if latest is not None else -1
        self._preempted |= preempted
        if not self._relax:
            return
        if 0 in self._preempted:
            logger.warning(
                "Ranks %s are preempted, rank 0 among them: reports still wait for every rank "
                "(relax_collectives_on_preemption needs rank 0 to survive)",
                sorted(self._preempted),
            )
            return
        survivors = self._world - self._preempted
        logger.info(
            "Ranks %s are preempted: reports complete with ranks %s",
            sorted(self._preempted),
            sorted(survivors),
        )
        self._collector.relax_to(survivors)

    def holds(self, ended: set[int]) -> bool:
        """Whether the survivors go on although the preempted ranks ``ended``: within the
        grace, no checkpoint committed since the notice."""
        if self._grace_s <= 0 or not ended <= self._preempted or not self._world - ended:
            return False
        now = self._clock()
        if self._ends_at is None:
            self._ends_at = now + self._grace_s
            logger.info(
                "Ranks %s were preempted; the others go on for up to %g s to commit a checkpoint",
                sorted(ended),
                self._grace_s,
            )
        latest = self._manager.latest
        since = -1 if self._latest_at_notice is None else self._latest_at_notice
        committed = latest is not None and latest.index > since
        return not committed and now < self._ends_at
