"""The equal split of a pass: every rank the same number of rows, each row once, the documented
rows dropped."""

from __future__ import annotations

import pytest

from trainlib._internal.worker.rows_per_rank import EqualSplit, Segment, pass_order, windows


def _shares(lengths: list[int], world_size: int, order: list[int]) -> list[list[tuple[int, int]]]:
    """Each rank's rows as (partition, row) pairs, after a whole pass in ``order``."""
    splits = [EqualSplit(world_size, rank) for rank in range(world_size)]
    shares: list[list[tuple[int, int]]] = [[] for _ in range(world_size)]
    for window in windows(order, world_size):
        sizes = [(p, lengths[p]) for p in window]
        for rank, split in enumerate(splits):
            for segment in split.take(sizes):
                shares[rank] += [(segment.partition, r) for r in range(segment.start, segment.stop)]
    assert len({tuple(s.carry) for s in splits}) == 1  # every rank plans the same leftover
    return shares


@pytest.mark.parametrize(
    ("lengths", "world_size"),
    [
        ([300, 250, 333, 117], 2),
        ([10, 0, 7, 1, 1, 30, 2], 3),
        ([1, 1, 1], 4),  # fewer rows per partition than ranks
        ([5], 1),
        ([2500] * 24, 8),
    ],
)
def test_split_gives_equal_disjoint_shares_and_drops_only_the_tail(
    lengths: list[int], world_size: int
) -> None:
    order = pass_order(len(lengths), seed=7)
    shares = _shares(lengths, world_size, order)
    total = sum(lengths)
    assert {len(s) for s in shares} == {total // world_size}
    seen = [row for share in shares for row in share]
    assert len(seen) == len(set(seen))
    in_pass_order = [(p, r) for p in order for r in range(lengths[p])]
    dropped = in_pass_order[len(in_pass_order) - total % world_size :] if total % world_size else []
    assert set(in_pass_order) - set(seen) == set(dropped)


def test_split_rank_reads_mostly_the_partition_computed_next_to_it() -> None:
    shares = _shares([100] * 4, 2, [0, 1, 2, 3])
    assert {p for p, _ in shares[0]} == {0, 2} and {p for p, _ in shares[1]} == {1, 3}


def test_split_carries_fewer_rows_than_ranks() -> None:
    split = EqualSplit(3, 0)
    assert split.take([(0, 4)]) == [Segment(0, 0, 1)]
    assert split.carry == [Segment(0, 3, 4)]


def test_pass_order_is_seeded_and_differs_between_seeds() -> None:
    assert pass_order(20, seed=1) == pass_order(20, seed=1)
    assert pass_order(20, seed=1) != pass_order(20, seed=2)
    assert pass_order(5, seed=None) == [0, 1, 2, 3, 4]
