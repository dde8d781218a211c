"""The hang watchdog: a rank that stops reporting while the run makes no progress is hung.

The clock starts once every rank has joined the process group: start-up (imports, rendezvous)
is bounded by the process group's own timeout instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trainlib._internal.driver.ranks import WorkerSlot
from trainlib.errors import RankFailure

AUTO_FACTOR = 5.0
AUTO_MINIMUM_S = 60.0


class ProgressWatchdog:
    """Watches one attempt's reports; ``check()`` names the hung ranks once the timeout passes."""

    def __init__(
        self,
        timeout_s: float | None,
        slots: list[WorkerSlot],
        clock: Callable[[], float] = time.monotonic,
        automatic: bool = True,
    ) -> None:
        self._timeout_s = timeout_s
        self._automatic = automatic
        self._slots = slots
        self._clock = clock
        self._last_progress = clock()
        self._started: set[int] = set()
        self._longest_interval = 0.0
        self._completed = 0
        self._last_index: dict[int, int] = {}

    @property
    def timeout_s(self) -> float | None:
        """The timeout in force: the configured one, else (``automatic``) derived from report
        intervals."""
        if self._timeout_s is not None:
            return self._timeout_s
        if self._completed == 0 or not self._automatic:
            return None
        return max(AUTO_MINIMUM_S, AUTO_FACTOR * self._longest_interval)

    def on_started(self, world_rank: int) -> None:
        """A rank joined the process group; when all have, the clock starts."""
        self._started.add(world_rank)
        if len(self._started) == len(self._slots):
            self._last_progress = self._clock()

    def resume(self) -> None:
        """The run is asked for progress again after an idle spell (a live group's next
        call): the clock restarts now, and the idle time counts as no interval."""
        self._last_progress = self._clock()

    def on_report(self, world_rank: int, index: int) -> None:
        """A rank made report ``index``."""
        self._last_index[world_rank] = index

    def on_complete(self) -> None:
        """Every rank made the same report: the run made progress."""
        now = self._clock()
        self._longest_interval = max(self._longest_interval, now - self._last_progress)
        self._last_progress = now
        self._completed += 1

    def check(self) -> dict[int, RankFailure]:
        """The hung ranks (those behind the others, or all if none reported), if timed out."""
        timeout = self.timeout_s
        idle = self._clock() - self._last_progress
        if timeout is None or idle <= timeout or len(self._started) < len(self._slots):
            return {}
        frontier = max(self._last_index.values(), default=-1)
        behind = [s for s in self._slots if self._last_index.get(s.world_rank, -1) < frontier]
        return {
            slot.world_rank: RankFailure(
                slot.world_rank,
                slot.host,
                "hang",
                f"made no progress for {idle:.0f} s (hang_timeout_s={timeout:g}); its last "
                f"report was {self._describe(slot.world_rank)}",
                time=time.time(),
            )
            for slot in behind or self._slots
        }

    def _describe(self, world_rank: int) -> str:
        index = self._last_index.get(world_rank)
        return "none in this attempt" if index is None else f"#{index}"
