"""Worker leases: which Dask workers each of several concurrent runs on one cluster holds.

A Tuner runs its trials as concurrent runs on one Dask client. Each trial holds its workers
exclusively while it runs: the Tuner reserves them in a ``WorkerBook`` before the trial
starts, the trial's run selects its ranks only among them (``select_workers(allowed=...)``),
and the Tuner releases them when the trial has ended (its ranks stopped). If a held worker
leaves the cluster, the run's next attempt takes a free one in its place. A worker whose
rank did not stop when asked (its run gave up waiting) is withheld for good: its rank may
still be running, so no later trial is given it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

_WITHHELD = "<withheld: its rank did not stop>"


class WorkerBook:
    """The driver's book of held workers: address -> the run holding it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: dict[str, str] = {}
        self._released_at: dict[str, int] = {}  # address -> release order (oldest first)
        self._releases = 0

    def free(self, live: Collection[str]) -> list[str]:
        """Live workers nobody holds, longest free first (its idle rank process is readiest)."""
        with self._lock:
            free = [a for a in live if a not in self._holder]
        return sorted(free, key=lambda a: (self._released_at.get(a, -1), a))

    def reserve(self, owner: str, count: int, live: Collection[str]) -> bool:
        """Hold ``count`` free live workers for ``owner``; False (nothing held) if too few."""
        free = self.free(live)
        if len(free) < count:
            return False
        with self._lock:
            for address in free[:count]:
                self._holder[address] = owner
        return True

    def lease(self, owner: str, count: int) -> WorkerLease:
        """The view a run of ``owner`` selects its workers through."""
        return WorkerLease(self, owner, count)

    def release(self, owner: str) -> None:
        """Free every worker ``owner`` holds."""
        with self._lock:
            for address in [a for a, o in self._holder.items() if o == owner]:
                del self._holder[address]
                self._released_at[address] = self._releases
                self._releases += 1

    def withhold(self, addresses: Collection[str]) -> None:
        """Never lend these workers again (a rank on them did not stop when asked)."""
        with self._lock:
            for address in addresses:
                self._holder[address] = _WITHHELD

    def top_up(self, owner: str, count: int, eligible: Collection[str]) -> set[str]:
        """``owner``'s eligible held workers, topped up from free eligible ones to ``count``.

        Held workers no longer eligible (gone, or unresponsive) are given up.
        """
        with self._lock:
            held = {a for a, o in self._holder.items() if o == owner}
            for address in held - set(eligible):
                del self._holder[address]
            mine = held & set(eligible)
            for address in sorted(set(eligible) - set(self._holder)):
                if len(mine) >= count:
                    break
                self._holder[address] = owner
                mine.add(address)
            return mine


class WorkerLease:
    """One run's share of a ``WorkerBook``: the workers it may select its ranks from."""

    def __init__(self, book: WorkerBook, owner: str, count: int) -> None:
        self._book = book
        self.owner = owner
        self.count = count

    def allowed(self, eligible: Collection[str]) -> set[str]:
        """Of the eligible workers, those this run may use now."""
        return self._book.top_up(self.owner, self.count, eligible)

    def withhold(self, addresses: Collection[str]) -> None:
        """Give up these workers for the rest of the search: a rank on them did not stop."""
        self._book.withhold(addresses)
