"""Cutting a rank's blocks into batches: in order, or sampled from a local shuffle buffer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

Block = dict[str, np.ndarray]


class RowBuffer:
    """Rows of blocks, taken at random (swap-remove: O(batch) work per batch taken)."""

    def __init__(self) -> None:
        self._columns: Block = {}
        self.size = 0

    def append(self, block: Block) -> None:
        if not block:  # no columns (a part of map_groups without groups): no rows
            return
        rows = len(next(iter(block.values())))
        if not self._columns:
            self._columns = {
                k: np.empty((max(rows, 1) * 2, *v.shape[1:]), v.dtype) for k, v in block.items()
            }
        capacity = len(next(iter(self._columns.values())))
        if self.size + rows > capacity:
            grown = max(capacity * 2, self.size + rows)
            for name, values in self._columns.items():
                bigger = np.empty((grown, *values.shape[1:]), values.dtype)
                bigger[: self.size] = values[: self.size]
                self._columns[name] = bigger
        for name, values in block.items():
            self._columns[name][self.size : self.size + rows] = values
        self.size += rows

    def take_random(self, count: int, rng: np.random.Generator) -> Block:
        """``count`` rows drawn at random, in the order drawn (not the buffer's)."""
        chosen = rng.choice(self.size, size=count, replace=False)
        batch = {k: v[chosen] for k, v in self._columns.items()}
        tail_start = self.size - count
        holes = chosen[chosen < tail_start]
        tail = np.setdiff1d(np.arange(tail_start, self.size), chosen, assume_unique=True)
        for values in self._columns.values():
            values[holes] = values[tail]
        self.size -= count
        return batch


def batches(blocks: Iterator[Block], batch_size: int, drop_last: bool) -> Iterator[Block]:
    """Blocks re-cut into batches of ``batch_size`` rows, in order."""
    pending: list[Block] = []
    rows = 0
    for block in blocks:
        pending.append(block)
        rows += _num_rows(block)
        while rows >= batch_size:
            batch, pending = _split_front(pending, batch_size)
            rows -= batch_size
            yield batch
    if rows and not drop_last:
        yield _concat(pending)


def shuffled_batches(
    blocks: Iterator[Block],
    batch_size: int,
    drop_last: bool,
    buffer_rows: int,
    rng: np.random.Generator,
) -> Iterator[Block]:
    """Batches sampled at random from a buffer of at least ``buffer_rows`` rows."""
    buffer = RowBuffer()
    minimum = max(buffer_rows, batch_size)
    for block in blocks:
        buffer.append(block)
        while buffer.size >= minimum:
            yield buffer.take_random(batch_size, rng)
    while buffer.size >= batch_size:
        yield buffer.take_random(batch_size, rng)
    if buffer.size and not drop_last:
        yield buffer.take_random(buffer.size, rng)


def _split_front(pending: list[Block], count: int) -> tuple[Block, list[Block]]:
    """The first ``count`` rows of the pending blocks, and what is left of them."""
    taken: list[Block] = []
    needed = count
    rest = list(pending)
    while needed:
        block = rest.pop(0)
        rows = _num_rows(block)
        if rows <= needed:
            taken.append(block)
            needed -= rows
        else:
            taken.append({k: v[:needed] for k, v in block.items()})
            rest.insert(0, {k: v[needed:] for k, v in block.items()})
            needed = 0
    return _concat(taken), rest


def _concat(blocks: list[Block]) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}


def _num_rows(block: Block) -> int:
    return len(next(iter(block.values()))) if block else 0
