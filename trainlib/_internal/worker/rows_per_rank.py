"""Which rows of a pass over a dataset go to which rank: equal counts, streaming, no coordinator.

A pass takes the partitions in one order (shuffled per pass for a split dataset) and deals
them in windows of ``world_size`` partitions. The rows of a window, after the rows carried
over from the window before, are cut into ``world_size`` equal contiguous ranges, one per rank
in rank order; the fewer than ``world_size`` rows left over are carried into the next window.
Every rank computes the same plan from the same partition lengths, so no process coordinates.

What a pass drops: the rows still carried after the last window, i.e. the last
``num_rows % world_size`` rows of the pass's partition order (at most ``world_size - 1``).
Partition ``i`` of a window is computed next to rank ``i``, so most rows a rank reads are local.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of one partition."""

    partition: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def pass_order(num_partitions: int, seed: int | None) -> list[int]:
    """The partition order of one pass: shuffled by ``seed``, or natural without one."""
    order = list(range(num_partitions))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return order


def windows(order: Sequence[int], world_size: int) -> Iterator[list[int]]:
    """The order cut into windows of ``world_size`` partitions (the last may be shorter)."""
    for start in range(0, len(order), world_size):
        yield list(order[start : start + world_size])


class EqualSplit:
    """One rank's share of a pass, window by window; all ranks' shares have equal size."""

    def __init__(self, world_size: int, world_rank: int) -> None:
        self._world_size = world_size
        self._world_rank = world_rank
        self.carry: list[Segment] = []

    def take(self, window: Sequence[tuple[int, int]]) -> list[Segment]:
        """This rank's segments of a window given as ``(partition, num_rows)`` pairs."""
        rows = self.carry + [Segment(p, 0, n) for p, n in window if n > 0]
        total = sum(s.num_rows for s in rows)
        share = total // self._world_size
        mine = _cut(rows, self._world_rank * share, (self._world_rank + 1) * share)
        self.carry = _cut(rows, self._world_size * share, total)
        return mine


def _cut(rows: list[Segment], start: int, stop: int) -> list[Segment]:
    """The segments covering positions ``start:stop`` of the concatenation of ``rows``."""
    found, offset = [], 0
    for segment in rows:
        low, high = max(start, offset), min(stop, offset + segment.num_rows)
        if low < high:
            first = segment.start + low - offset
            found.append(Segment(segment.partition, first, first + high - low))
        offset += segment.num_rows
    return found
