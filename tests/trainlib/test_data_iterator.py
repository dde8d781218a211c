"""Batching, local shuffling and prefetching of the blocks a rank receives."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from trainlib.data import _batching
from trainlib.data._conversion import tensor as _tensor
from trainlib.data.iterator import _prefetched, _staged_ahead


def _blocks(*sizes: int) -> Iterator[dict[str, np.ndarray]]:
    start = 0
    for size in sizes:
        ids = np.arange(start, start + size)
        yield {"id": ids, "image": np.stack([np.full((3, 2, 2), i, np.uint8) for i in ids])}
        start += size


def test_iterator_batches_cross_block_boundaries_in_order() -> None:
    batches = list(_batching.batches(_blocks(5, 2, 6), batch_size=4, drop_last=False))
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]]
    assert batches[1]["image"][:, 0, 0, 0].tolist() == [4, 5, 6, 7]


def test_iterator_drop_last_drops_the_short_batch() -> None:
    batches = list(_batching.batches(_blocks(5, 2, 6), batch_size=4, drop_last=True))
    assert [len(b["id"]) for b in batches] == [4, 4, 4]


def test_iterator_shuffle_buffer_yields_every_row_once_in_a_seeded_order() -> None:
    def ids(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        batches = _batching.shuffled_batches(_blocks(7, 9, 4), 3, False, 8, rng)
        return [i for b in batches for i in b["id"].tolist()]

    assert sorted(ids(0)) == list(range(20))
    assert ids(0) == ids(0) and ids(0) != ids(1) and ids(0) != list(range(20))


def test_iterator_shuffle_buffer_batch_rows_come_in_the_order_drawn() -> None:
    """A shard that fits in one batch is not given back in file order (nor sorted)."""
    orders = {
        tuple(next(_batching.shuffled_batches(_blocks(8), 8, False, 8, rng))["id"].tolist())
        for rng in (np.random.default_rng(seed) for seed in range(5))
    }
    assert len(orders) == 5 and tuple(range(8)) not in orders
    assert all(sorted(order) == list(range(8)) for order in orders)


def test_iterator_shuffle_buffer_holds_at_least_its_size_before_the_first_batch() -> None:
    rng = np.random.default_rng(0)
    first = next(_batching.shuffled_batches(_blocks(5, 5, 5), 2, False, 10, rng))
    assert max(first["id"]) < 10  # drawn from the buffer of the first 10 rows


def test_iterator_prefetch_passes_items_and_errors_through() -> None:
    assert list(_prefetched(iter(range(5)), 2)) == [0, 1, 2, 3, 4]

    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("bad block")

    with pytest.raises(ValueError, match="bad block"):
        list(_prefetched(broken(), 1))


def test_iterator_tensor_dtypes_and_object_columns() -> None:
    cpu = torch.device("cpu")
    assert _tensor("x", np.arange(3), torch.float32, cpu).dtype == torch.float32
    assert _tensor("x", np.arange(3), {"x": torch.int32}, cpu).dtype == torch.int32
    with pytest.raises(TypeError, match="Column 'name' holds Python str values"):
        _tensor("name", np.array(["a", "b"], dtype=object), None, cpu)


def test_iterator_tensor_stacks_a_column_of_equal_length_lists_as_ray_data_does() -> None:
    cpu = torch.device("cpu")
    lists = np.empty(3, dtype=object)
    lists[:] = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    stacked = _tensor("features", lists, None, cpu)
    assert stacked.shape == (3, 2) and stacked.tolist() == [[1, 2], [3, 4], [5, 6]]
    arrays = np.empty(2, dtype=object)
    arrays[:] = [np.zeros((2, 2), np.uint8), np.ones((2, 2), np.uint8)]
    assert _tensor("image", arrays, torch.float32, cpu).shape == (2, 2, 2)
    ragged = np.empty(2, dtype=object)
    ragged[:] = [[1, 2], [3]]
    with pytest.raises(TypeError, match=r"list values of different lengths.*pad or crop"):
        _tensor("tokens", ragged, None, cpu)
    words = np.empty(2, dtype=object)
    words[:] = [["a"], ["b"]]
    with pytest.raises(TypeError, match="Column 'words' holds Python list values"):
        _tensor("words", words, None, cpu)


class _RecordingStager:
    """Stands in for DeviceStager's contract (stage where made, ready where used) on CPU."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def stage(self, batch: int) -> int:
        self.calls.append(f"stage {batch}")
        return batch

    def ready(self, staged: int) -> int:
        self.calls.append(f"ready {staged}")
        return staged


def test_iterator_kept_batches_are_staged_ahead_in_order_without_a_thread() -> None:
    stager = _RecordingStager()
    made: list[str] = []

    def batches() -> Iterator[int]:
        for i in range(4):
            made.append(threading.current_thread().name)
            yield i

    got = list(_staged_ahead(batches(), 2, stager))  # type: ignore[arg-type]
    assert got == [0, 1, 2, 3]
    assert stager.calls == [
        "stage 0", "stage 1", "stage 2", "ready 0", "stage 3", "ready 1", "ready 2", "ready 3"
    ]  # fmt: skip
    assert set(made) == {threading.current_thread().name}
    assert list(_staged_ahead(iter(range(3)), 0, None)) == [0, 1, 2]
