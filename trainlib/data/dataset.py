"""Dataset: Ray Data's ``Dataset`` on Dask, a tuple of blocks computed by Dask tasks.

Each block is a pandas DataFrame (a tensor column holds one array per row) made by a
``dask.delayed`` task; transforms add a task per block and run nothing until the data is
consumed (``take``, ``iter_batches``, ...) or trained on (``TorchTrainer(datasets=)`` streams
the blocks into the ranks), on this process's Dask client if any, else Dask's local threads.
Unlike Ray: ``concurrency``, ``compute`` and a task's CPU and GPU counts are accepted and bound
nothing; a callable class is constructed once per process; ``limit``, ``split(equal=True)``
and ``train_test_split`` read the rows they need when called; ``random_shuffle``,
``repartition``, ``sort`` and ``groupby().map_groups`` bring every row into one task (a
dataset that fits one worker's memory).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trainlib.data import _blocks
from trainlib.data.grouped_data import GroupedData
from trainlib.data.schema import Schema

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from dask.dataframe import DataFrame as DaskFrame
    from dask.delayed import Delayed

    from trainlib.data.aggregate import AggregateFn


class Dataset:
    """Rows in blocks, transformed lazily by Dask tasks (Ray Data's ``Dataset``)."""

    def __init__(self, blocks: Sequence[Delayed]) -> None:
        self._blocks = tuple(blocks)

    # -- transforms: one more task per block, nothing run --------------------------------

    def map(self, fn: Callable[..., Any], **options: Any) -> Dataset:
        """Each row (a dict) through ``fn``, which returns the new row."""
        return self._per_block(_blocks.map_rows, self._callable(fn, options), "map")

    def flat_map(self, fn: Callable[..., Any], **options: Any) -> Dataset:
        """Each row through ``fn``, which returns a list of rows."""
        return self._per_block(_blocks.map_rows, self._callable(fn, options), "flat_map")

    def filter(self, fn: Callable[..., Any], **options: Any) -> Dataset:
        """The rows for which ``fn(row)`` is true."""
        return self._per_block(_blocks.map_rows, self._callable(fn, options), "filter")

    def map_batches(
        self,
        fn: Callable[..., Any],
        *,
        batch_size: int | str | None = "default",
        batch_format: str | None = "default",
        **options: Any,
    ) -> Dataset:
        """Each batch of ``batch_size`` rows (1024 by default, None: a whole block) through
        ``fn``, which returns a dict of arrays or a DataFrame (any number of rows). ``fn`` may
        be a callable class (``fn_constructor_args``/``fn_constructor_kwargs``); ``fn_args``
        and ``fn_kwargs`` follow the batch."""
        size = 1024 if batch_size == "default" else batch_size
        fmt = _blocks.check_format(batch_format)
        return self._per_block(_blocks.map_batches, self._callable(fn, options), size, fmt)

    def add_column(self, col: str, fn: Callable[[pd.DataFrame], Any]) -> Dataset:
        """A column ``fn(batch)`` computes from each batch (a DataFrame)."""
        return self.map_batches(lambda b: b.assign(**{col: fn(b)}), batch_format="pandas")

    def drop_columns(self, cols: list[str]) -> Dataset:
        return self.map_batches(lambda b: b.drop(columns=cols), batch_format="pandas")

    def select_columns(self, cols: list[str]) -> Dataset:
        return self.map_batches(lambda b: b[list(cols)], batch_format="pandas")

    def rename_columns(self, names: Mapping[str, str]) -> Dataset:
        return self.map_batches(lambda b: b.rename(columns=dict(names)), batch_format="pandas")

    def limit(self, limit: int) -> Dataset:
        """The first ``limit`` rows (the blocks are read in order until there are enough)."""
        return from_frame(self.to_pandas(limit=limit), 1)

    def union(self, *others: Dataset) -> Dataset:
        return Dataset(self._blocks + tuple(b for other in others for b in other._blocks))

    def random_shuffle(self, *, seed: int | None = None, num_blocks: int | None = None) -> Dataset:
        """Every row in a random order (all rows meet in one task: a dataset that fits one
        worker's memory)."""
        return self._all_to_all(_blocks.shuffled, seed, num_blocks or len(self._blocks))

    def repartition(self, num_blocks: int, *, shuffle: bool = False) -> Dataset:
        return self._all_to_all(_blocks.shuffled if shuffle else _blocks.kept, None, num_blocks)

    def sort(self, key: str | list[str], descending: bool = False) -> Dataset:
        return self._all_to_all(_blocks.sorted_by(key, descending), None, len(self._blocks))

    def split(self, n: int, *, equal: bool = False) -> list[Dataset]:
        """``n`` datasets: the blocks dealt out in turn, or with ``equal`` the same number of
        rows each (rows left over dropped, as Ray's)."""
        if not equal:
            return [Dataset(self._blocks[i::n]) for i in range(n)]
        rows = self.to_pandas()
        each = len(rows) // n
        return [from_frame(rows.iloc[i * each : (i + 1) * each], 1) for i in range(n)]

    def train_test_split(
        self, test_size: float | int, *, shuffle: bool = False, seed: int | None = None
    ) -> tuple[Dataset, Dataset]:
        """A training and a test dataset; ``test_size`` a fraction or a number of rows."""
        rows = self.to_pandas()
        if shuffle:
            rows = _blocks.shuffled(rows, seed)
        count = int(test_size * len(rows)) if isinstance(test_size, float) else test_size
        cut = len(rows) - count
        return from_frame(rows.iloc[:cut], 1), from_frame(rows.iloc[cut:], 1)

    def materialize(self) -> Dataset:
        """The blocks computed now and kept (in the cluster's memory with a Dask client)."""
        from distributed import default_client

        try:
            return Dataset(default_client().persist(list(self._blocks)))
        except ValueError:  # no client: computed here
            return Dataset([_blocks.delayed(block) for block in self._compute(self._blocks)])

    # -- consumption ---------------------------------------------------------------------

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        for block in self._iter_blocks():
            yield from _blocks.rows(block)

    def iter_batches(
        self,
        *,
        batch_size: int | None = 256,
        batch_format: str | None = "default",
        drop_last: bool = False,
        **hints: Any,
    ) -> Iterator[Any]:
        """Batches of ``batch_size`` rows (None: one per block) as dicts of arrays, or
        DataFrames with ``batch_format="pandas"``."""
        import pandas as pd

        fmt, pending = _blocks.check_format(batch_format), pd.DataFrame()
        for block in filter(len, self._iter_blocks()):  # an empty block has no say
            pending = pd.concat([pending, block], ignore_index=True) if len(pending) else block
            size = batch_size or len(pending)
            while size and len(pending) >= size:
                yield _blocks.batch(pending.iloc[:size], fmt)
                pending = pending.iloc[size:].reset_index(drop=True)
        if len(pending) and not drop_last:
            yield _blocks.batch(pending, fmt)

    def iter_torch_batches(
        self,
        *,
        batch_size: int | None = 256,
        dtypes: torch.dtype | Mapping[str, torch.dtype] | None = None,
        device: str = "cpu",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        drop_last: bool = False,
        **hints: Any,
    ) -> Iterator[Any]:
        """Batches as dicts of tensors (of ``dtypes``, on ``device``), or ``collate_fn``'s."""
        for batch in self.iter_batches(batch_size=batch_size, drop_last=drop_last):
            yield collate_fn(batch) if collate_fn else _blocks.tensors(batch, dtypes, device)

    def take(self, limit: int = 20) -> list[dict[str, Any]]:
        return list(_blocks.rows(self.to_pandas(limit=limit)))

    def take_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        return list(_blocks.rows(self.to_pandas(limit=limit)))

    def take_batch(self, batch_size: int = 20, *, batch_format: str | None = "default") -> Any:
        return _blocks.batch(self.to_pandas(limit=batch_size), _blocks.check_format(batch_format))

    def show(self, limit: int = 20) -> None:
        for row in self.take(limit):
            print(row)

    def count(self) -> int:
        return int(sum(self._compute([_blocks.delayed(len)(b) for b in self._blocks])))

    def schema(self) -> Schema:
        empty = self._empty_frame()
        return Schema([str(c) for c in empty.columns], list(empty.dtypes))

    def columns(self) -> list[str]:
        return self.schema().names

    def num_blocks(self) -> int:
        return len(self._blocks)

    def unique(self, column: str) -> list[Any]:
        return list(self.to_pandas()[column].unique())

    def sum(self, on: str) -> Any:
        return _blocks.plain(self.to_pandas()[on].sum())

    def min(self, on: str) -> Any:
        return _blocks.plain(self.to_pandas()[on].min())

    def max(self, on: str) -> Any:
        return _blocks.plain(self.to_pandas()[on].max())

    def mean(self, on: str) -> Any:
        return _blocks.plain(self.to_pandas()[on].mean())

    def std(self, on: str, ddof: int = 1) -> Any:
        return _blocks.plain(self.to_pandas()[on].std(ddof=ddof))

    def groupby(self, key: str | list[str]) -> GroupedData[Dataset]:
        """The rows grouped by ``key`` (Ray's ``GroupedData``: aggregations, ``map_groups``)."""
        return GroupedData(self, key)

    def aggregate(self, *aggs: AggregateFn) -> dict[str, Any]:
        """Each aggregation (``trainlib.data.aggregate``) over every row, by its name."""
        rows = self.to_pandas()
        return {a.name: _blocks.plain(a.of(rows[a.on] if a.on else rows)) for a in aggs}

    def to_pandas(self, limit: int | None = None) -> pd.DataFrame:
        """The rows as one DataFrame (the first ``limit``: blocks read until there are)."""
        return _blocks.first_rows(self._iter_blocks(), limit)

    def to_dask(self) -> DaskFrame:
        """A Dask DataFrame of the blocks (its schema read from the first block)."""
        import dask.dataframe as dd

        return dd.from_delayed(list(self._blocks), meta=self._empty_frame(), verify_meta=False)

    def _empty_frame(self) -> pd.DataFrame:
        """The first block's columns and types, no rows (an empty frame without blocks)."""
        import pandas as pd

        first = next(self._iter_blocks(), None)
        return first.iloc[:0] if first is not None else pd.DataFrame()

    def frame_partitions(self) -> list[Delayed]:
        """The blocks' tasks, each a pandas DataFrame: what ``TorchTrainer(datasets=)`` reads."""
        return list(self._blocks)

    def write_parquet(self, path: str, **kwargs: Any) -> None:
        self._compute(_blocks.writes(self._blocks, path, "parquet", kwargs))

    def write_csv(self, path: str, **kwargs: Any) -> None:
        self._compute(_blocks.writes(self._blocks, path, "csv", kwargs))

    def __repr__(self) -> str:
        return f"Dataset(num_blocks={len(self._blocks)})"

    # -- helpers --------------------------------------------------------------------------

    def _callable(self, fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
        args, kwargs = options.get("fn_args") or (), options.get("fn_kwargs") or {}
        made = (
            options.get("fn_constructor_args") or (),
            options.get("fn_constructor_kwargs") or {},
        )
        token = uuid.uuid4().hex

        def call(value: Any) -> Any:
            return _blocks.instance(fn, token, *made)(value, *args, **kwargs)

        return call

    def _per_block(self, step: Callable[..., Any], *args: Any) -> Dataset:
        return Dataset([_blocks.delayed(step)(block, *args) for block in self._blocks])

    def _all_to_all(self, order: Callable[..., Any], seed: int | None, n: int) -> Dataset:
        whole = _blocks.delayed(_blocks.concat)(list(self._blocks))
        arranged = _blocks.delayed(order)(whole, seed)
        return Dataset([_blocks.delayed(_blocks.part)(arranged, i, n) for i in range(max(1, n))])

    def _iter_blocks(self) -> Iterator[pd.DataFrame]:
        for block in self._blocks:  # one at a time: the first rows come before the last
            yield self._compute([block])[0]

    def _compute(self, tasks: Sequence[Any]) -> list[Any]:
        from dask.base import compute

        return list(compute(*tasks))


def from_frame(rows: pd.DataFrame, num_blocks: int) -> Dataset:
    n = max(1, num_blocks)
    return Dataset([_blocks.delayed(_blocks.part(rows, i, n)) for i in range(n)])
