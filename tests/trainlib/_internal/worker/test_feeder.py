"""The feeder in a rank's supervisor: which rows of each pass it sends the rank, and in what
order, computed where. The Dask client is a stand-in that computes each partition at once in
this process (Dask's synchronous scheduler); no cluster, no rank process."""

from __future__ import annotations

import pickle
import queue
from collections.abc import Iterator
from typing import Any

import dask.array as da
import numpy as np
import pytest
from dask.delayed import delayed

from trainlib import DataConfig, DatasetError
from trainlib._internal.common.datasets import DatasetSource, arrays_to_block, sources_from
from trainlib._internal.common.messages import DataBlock, FeedPlan
from trainlib._internal.worker.feeder import Feeder

WORKERS = ("tcp://w0", "tcp://w1")
WAIT_S = 10.0


class Computed:
    """A Dask future whose result is already there."""

    key = "computed"

    def __init__(self, value: Any) -> None:
        self.value = value
        self.released = False

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value

    def add_done_callback(self, callback: Any) -> None:
        callback(self)

    def release(self) -> None:
        self.released = True


class Client:
    """Computes what the feeder asks for at once; remembers where it asked for it."""

    def __init__(self) -> None:
        self.placed: list[str] = []
        self.futures: list[Computed] = []

    def compute(self, block: Any, workers: list[str], allow_other_workers: bool) -> Computed:
        self.placed.append(workers[0])
        try:
            value = block.compute(scheduler="sync")
        except Exception as exc:
            value = exc
        future = Computed(value)
        self.futures.append(future)
        return future

    def submit(self, function: Any, *args: Any, pure: bool) -> Computed:
        values = [a.result() if isinstance(a, Computed) else a for a in args]
        return Computed(function(*values))


class Rank:
    """The rank's end of the feeder: asks for blocks, reads what is sent."""

    def __init__(self, source: DatasetSource, world_rank: int, seed: int | None = None) -> None:
        self.client = Client()
        self._sent: queue.Queue[DataBlock] = queue.Queue()
        plan = FeedPlan((source,), world_rank, WORKERS, seed, attempt_key=0)
        self.feeder = Feeder(plan, self.client, self._sent.put)  # type: ignore[arg-type]
        self._name = source.name

    def next_block(self, pass_id: int) -> dict[str, np.ndarray] | Exception | None:
        self.feeder.request(self._name, pass_id)
        sent = self._sent.get(timeout=WAIT_S)
        assert (sent.dataset, sent.pass_id) == (self._name, pass_id)
        return pickle.loads(pickle.dumps(sent.block))  # as the rank unpickles it

    def one_pass(self, pass_id: int = 0) -> list[int]:
        values: list[int] = []
        while (block := self.next_block(pass_id)) is not None:
            assert isinstance(block, dict), block
            values.extend(block["x"].tolist())
        return values


@pytest.fixture
def ranks() -> Iterator[list[Rank]]:
    made: list[Rank] = []
    yield made
    for rank in made:
        rank.feeder.close()


def source(num_rows: int, chunk: int, split: bool = True) -> DatasetSource:
    config = DataConfig(datasets_to_split="all" if split else [])
    arrays = {"x": da.arange(num_rows, chunks=chunk)}
    return sources_from({"train": arrays}, config)["train"]


def test_feeder_split_gives_each_rank_equal_disjoint_rows(ranks: list[Rank]) -> None:
    ranks.extend(Rank(source(23, 5), world_rank) for world_rank in (0, 1))
    shares = [rank.one_pass() for rank in ranks]
    assert [len(share) for share in shares] == [11, 11]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(22))  # only the last row is dropped


def test_feeder_unsplit_dataset_gives_every_rank_every_row_in_order(ranks: list[Rank]) -> None:
    ranks.extend(Rank(source(12, 5, split=False), world_rank) for world_rank in (0, 1))
    assert [rank.one_pass() for rank in ranks] == [list(range(12))] * 2


def test_feeder_computes_each_partition_of_a_window_next_to_its_rank(ranks: list[Rank]) -> None:
    ranks.append(Rank(source(20, 5), world_rank=1))
    ranks[0].one_pass()
    assert ranks[0].client.placed == list(WORKERS) * 2  # partition i of a window near rank i


def test_feeder_shuffles_each_pass_the_same_way_for_every_rank(ranks: list[Rank]) -> None:
    ranks.extend(Rank(source(40, 5), world_rank, seed=7) for world_rank in (0, 1))
    first, second = ([rank.one_pass(pass_id) for rank in ranks] for pass_id in (0, 1))
    assert sorted(first[0] + first[1]) == sorted(second[0] + second[1]) == list(range(40))
    assert first != second  # another partition order every pass
    assert first[0] != list(range(20))


def test_feeder_starts_over_when_the_rank_starts_a_new_pass(ranks: list[Rank]) -> None:
    ranks.append(Rank(source(12, 4, split=False), world_rank=0))
    first = ranks[0].next_block(0)
    assert isinstance(first, dict) and first["x"].tolist() == [0, 1, 2, 3]
    assert ranks[0].one_pass(1) == list(range(12))


def test_feeder_sends_a_computing_error_to_the_rank(ranks: list[Rank]) -> None:
    def broken() -> dict[str, np.ndarray]:
        raise ValueError("bad row in part 0")

    failing = DatasetSource("train", (delayed(broken)(),), split=True, lengths=None)
    ranks.append(Rank(failing, world_rank=1))
    error = ranks[0].next_block(0)
    assert isinstance(error, DatasetError)
    assert "datasets['train'] for rank 1 failed: ValueError: bad row in part 0" in str(error)


def test_feeder_partition_shorter_than_its_metadata_fails_clearly(ranks: list[Rank]) -> None:
    block = delayed(arrays_to_block)(("x",), np.arange(3))
    wrong = DatasetSource("train", (block,), split=False, lengths=(5,))
    ranks.append(Rank(wrong, world_rank=0))
    error = ranks[0].next_block(0)
    assert isinstance(error, DatasetError)
    assert "has 3 rows where rows 0:5 were planned" in str(error)


def test_feeder_releases_what_it_holds_when_closed(ranks: list[Rank]) -> None:
    rank = Rank(source(20, 5, split=False), world_rank=0)
    rank.next_block(0)  # a window computed ahead is held
    rank.feeder.close()
    for feed in rank.feeder._feeds.values():
        feed._thread.join(WAIT_S)
    assert rank.client.futures and all(f.released for f in rank.client.futures)


def test_feeder_by_default_keeps_partition_order_every_pass_as_ray_data_does(
    ranks: list[Rank],
) -> None:
    seed = DataConfig().shuffle_seed
    ranks.extend(Rank(source(40, 5), world_rank, seed=seed) for world_rank in (0, 1))
    first, second = ([rank.one_pass(pass_id) for rank in ranks] for pass_id in (0, 1))
    assert first == second
    assert all(share == sorted(share) for share in first)
