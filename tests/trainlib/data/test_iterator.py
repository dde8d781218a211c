"""DataIterator in a rank: batches cut from the blocks its supervisor sends, pass by pass.

The supervisor is a stand-in that answers each ``data_next`` request on the rank's session at
once, from blocks fixed per pass; no Dask, no rank process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fsspec.implementations.local import LocalFileSystem

from tests.helpers import single_rank_spec
from trainlib import DatasetError
from trainlib._internal.common.messages import (
    CachePlan,
    DataBlock,
    DataRequest,
    RankMessage,
)
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.rank.process_globals import RANK
from trainlib._internal.rank.session import Session
from trainlib.data import DataIterator

Block = dict[str, np.ndarray]


class Supervisor:
    """Serves the blocks of each pass in order, then ``None`` (the pass's end)."""

    def __init__(self, passes: dict[int, list[Block | Exception]]) -> None:
        self.passes = passes
        self.requests: list[tuple[str, int]] = []
        self._served: dict[int, int] = {}
        self.session: Session | None = None

    def send(self, message: RankMessage) -> None:
        assert isinstance(message, DataRequest)
        name, pass_id = message.dataset, message.pass_id
        self.requests.append((name, pass_id))
        position = self._served.get(pass_id, 0)
        self._served[pass_id] = position + 1
        blocks = self.passes[pass_id]
        block = blocks[position] if position < len(blocks) else None
        assert self.session is not None
        self.session.deliver(DataBlock(name, pass_id, block))


def rows(start: int, stop: int) -> Block:
    return {"x": np.arange(start, stop), "y": np.arange(start, stop) * 10}


@pytest.fixture
def storage(tmp_path: Path) -> RunStorage:
    return RunStorage(LocalFileSystem(), str(tmp_path))


@pytest.fixture(autouse=True)
def _no_session_left() -> Iterator[None]:
    yield
    RANK.reset()


def served(passes: dict[int, list[Block | Exception]], storage: RunStorage) -> Supervisor:
    """A rank's session, current in this process, whose supervisor serves ``passes``."""
    spec = single_rank_spec(storage, ("train",))
    supervisor = Supervisor(passes)
    supervisor.session = Session(spec, supervisor.send)
    RANK.start(supervisor.session)
    return supervisor


def test_iterator_cuts_batches_across_blocks_with_a_short_last_one(storage: RunStorage) -> None:
    served({0: [rows(0, 3), rows(3, 8)]}, storage)
    batches = list(DataIterator("train").iter_batches(batch_size=3, prefetch_batches=0))
    assert [list(b["x"]) for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [list(b["y"]) for b in batches][-1] == [60, 70]


def test_iterator_drop_last_drops_the_short_batch(storage: RunStorage) -> None:
    served({0: [rows(0, 3), rows(3, 8)]}, storage)
    batches = DataIterator("train").iter_batches(batch_size=3, drop_last=True)
    assert [len(b["x"]) for b in batches] == [3, 3]


def test_iterator_without_batch_size_yields_blocks_as_they_come(storage: RunStorage) -> None:
    served({0: [rows(0, 3), rows(3, 8)]}, storage)
    blocks = DataIterator("train").iter_batches(batch_size=None, prefetch_batches=0)
    assert [list(b["x"]) for b in blocks] == [[0, 1, 2], [3, 4, 5, 6, 7]]


def test_iterator_each_iteration_is_a_new_pass(storage: RunStorage) -> None:
    served({0: [rows(0, 2)], 1: [rows(50, 52)]}, storage)
    batches = DataIterator("train").iter_batches(batch_size=8)
    first, second = [[list(b["x"]) for b in batches] for _ in range(2)]
    assert (first, second) == ([[0, 1]], [[50, 51]])


def test_iterator_requests_one_block_ahead(storage: RunStorage) -> None:
    supervisor = served({0: [rows(0, 2), rows(2, 4), rows(4, 6)]}, storage)
    blocks = iter(DataIterator("train").iter_batches(batch_size=None, prefetch_batches=0))
    next(blocks)
    assert len(supervisor.requests) == 2  # the block it yields, and the next one
    next(blocks)
    assert len(supervisor.requests) == 3


def test_iterator_skips_answers_of_a_pass_left_unfinished(storage: RunStorage) -> None:
    served({0: [rows(0, 2), rows(2, 4)], 1: [rows(100, 102)]}, storage)
    batches = DataIterator("train").iter_batches(batch_size=None, prefetch_batches=0)
    unfinished = iter(batches)
    next(unfinished)  # pass 0's second block is already on its way
    assert [list(b["x"]) for b in batches] == [[100, 101]]


def test_iterator_raises_the_error_the_feeder_sent(storage: RunStorage) -> None:
    served({0: [rows(0, 2), DatasetError("partition 3 failed")]}, storage)
    with pytest.raises(DatasetError, match="partition 3 failed"):
        list(DataIterator("train").iter_batches(batch_size=1))


def test_iterator_read_only_arrays_become_writable(storage: RunStorage) -> None:
    block = rows(0, 4)
    block["x"].flags.writeable = False
    served({0: [block]}, storage)
    (batch,) = DataIterator("train").iter_batches(batch_size=None)
    assert batch["x"].flags.writeable


def test_iterator_cached_shard_serves_later_passes_without_requests(
    storage: RunStorage,
) -> None:
    supervisor = served({0: [rows(0, 3), rows(3, 6)]}, storage)
    plan = CachePlan(location="host", budget_bytes=10**6, shuffle=True, seed=3)
    batches = DataIterator("train", plan).iter_batches(batch_size=2, prefetch_batches=0)
    first = [x for b in batches for x in b["x"]]
    requests = len(supervisor.requests)
    second = [x for b in batches for x in b["x"]]
    assert len(supervisor.requests) == requests  # pass 1 was never asked of the supervisor
    assert sorted(second) == sorted(first) == list(range(6))
    assert second != first  # shuffled locally


def test_iterator_torch_batches_have_the_requested_dtypes(storage: RunStorage) -> None:
    served({0: [rows(0, 4)]}, storage)
    (batch,) = DataIterator("train").iter_torch_batches(
        batch_size=4, dtypes={"x": torch.float32}, device="cpu"
    )
    assert batch["x"].dtype == torch.float32
    assert batch["y"].dtype == torch.int64
    assert batch["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_iterator_torch_batches_take_dtypes_or_collate_fn_not_both(storage: RunStorage) -> None:
    served({0: [rows(0, 4)]}, storage)
    with pytest.raises(ValueError, match="dtypes or collate_fn, not both"):
        DataIterator("train").iter_torch_batches(dtypes=torch.float32, collate_fn=dict)


def test_iterator_outside_a_training_function_names_the_call() -> None:
    with pytest.raises(RuntimeError, match=r"DataIterator\('train'\).iter_batches\(\)"):
        list(DataIterator("train").iter_batches())
