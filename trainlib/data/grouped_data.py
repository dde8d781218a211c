"""Ray Data's ``GroupedData`` (``Dataset.groupby(key)``): aggregations by group and
``map_groups``, as Dask tasks.

An aggregation reads only the key and the columns it aggregates from each block, then groups
them in one task (pandas), groups sorted by key as Ray sorts them. ``map_groups`` brings every
row into one task to sort them by key (as ``Dataset.sort``: a dataset that fits one worker's
memory), cuts them into as many blocks as the dataset had, never splitting a group, and runs
``fn`` on each group of a block in that block's task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from trainlib.data import _blocks
from trainlib.data.aggregate import AggregateFn, Count, Max, Mean, Min, Std, Sum
from trainlib.errors import DatasetError

if TYPE_CHECKING:
    import pandas as pd


class _Blocks(Protocol):
    """What a grouping needs of a ``Dataset`` (which makes one from its blocks)."""

    _blocks: tuple[Any, ...]

    def __init__(self, blocks: Sequence[Any]) -> None: ...

    def columns(self) -> list[str]: ...

    def _callable(self, fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]: ...


D = TypeVar("D", bound=_Blocks)


class GroupedData(Generic[D]):
    """A dataset grouped by ``key`` (one column or several); nothing runs until a result is
    consumed. Each result is a dataset of the grouped one's type."""

    def __init__(self, dataset: D, key: str | list[str]) -> None:
        keys = [key] if isinstance(key, str) else key
        if not (isinstance(keys, list) and keys and all(isinstance(k, str) and k for k in keys)):
            raise DatasetError(
                f"Dataset.groupby({key!r}): give a column name or a list of them (for the whole "
                "dataset, use Dataset.count(), sum(), ... or Dataset.aggregate())."
            )
        self._dataset, self._keys = dataset, keys

    def __repr__(self) -> str:
        return f"GroupedData(dataset={self._dataset}, key={self._keys!r})"

    def aggregate(self, *aggs: AggregateFn) -> D:
        """A row per group: its key, then each aggregation's result (Ray's columns)."""
        if not aggs or not all(isinstance(agg, AggregateFn) for agg in aggs):
            raise DatasetError(
                "GroupedData.aggregate() takes one or more aggregations: Count(), Sum('x'), "
                "... from trainlib.data.aggregate."
            )
        wanted = list(dict.fromkeys(self._keys + [c for agg in aggs for c in agg.columns()]))
        pruned = [_blocks.delayed(_columns)(block, wanted) for block in self._dataset._blocks]
        whole = _blocks.delayed(_blocks.concat)(pruned)
        return type(self._dataset)([_blocks.delayed(_aggregated)(whole, self._keys, aggs)])

    def count(self) -> D:
        return self.aggregate(Count())

    def sum(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> D:
        return self._each(Sum, on, ignore_nulls=ignore_nulls)

    def min(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> D:
        return self._each(Min, on, ignore_nulls=ignore_nulls)

    def max(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> D:
        return self._each(Max, on, ignore_nulls=ignore_nulls)

    def mean(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> D:
        return self._each(Mean, on, ignore_nulls=ignore_nulls)

    def std(self, on: str | list[str] | None = None, ddof: int = 1, ignore_nulls: bool = True) -> D:
        return self._each(Std, on, ignore_nulls=ignore_nulls, ddof=ddof)

    def map_groups(
        self,
        fn: Callable[..., Any],
        *,
        batch_format: str | None = "default",
        **options: Any,
    ) -> D:
        """Each group's rows as one batch of ``batch_format`` through ``fn`` (a function or
        a callable class, with ``fn_args``/``fn_kwargs``/``fn_constructor_args``/
        ``fn_constructor_kwargs`` as ``map_batches``), which returns a batch of any number
        of rows; ``compute``, ``concurrency`` and resource hints are accepted, as
        ``map_batches`` accepts them."""
        fmt = _blocks.check_format(batch_format)
        call = self._dataset._callable(fn, options)
        blocks = self._dataset._blocks
        ordered = _blocks.delayed(_sorted)(
            _blocks.delayed(_blocks.concat)(list(blocks)), self._keys
        )
        n = max(1, len(blocks))
        return type(self._dataset)(
            [
                _blocks.delayed(_through_groups)(ordered, self._keys, i, n, call, fmt)
                for i in range(n)
            ]
        )

    def _each(self, kind: type[AggregateFn], on: str | list[str] | None, **settings: Any) -> D:
        """``kind`` of each column ``on`` (every column but the key's if None)."""
        if on is None:
            on = [c for c in self._dataset.columns() if c not in self._keys]
        names = [on] if isinstance(on, str) else list(on)
        return self.aggregate(*(kind(on=name, **settings) for name in names))


def _columns(block: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    missing = [name for name in names if name not in block.columns]
    if missing and len(block.columns):
        raise DatasetError(
            f"GroupedData: the dataset has no column {missing[0]!r}; its columns are "
            f"{[str(c) for c in block.columns]}."
        )
    return block[[n for n in names if n in block.columns]]


def _aggregated(rows: pd.DataFrame, keys: list[str], aggs: Sequence[AggregateFn]) -> Any:
    import pandas as pd

    if rows.empty:
        return pd.DataFrame(columns=keys + [agg.name for agg in aggs])
    found = []
    for key, group in rows.groupby(keys, sort=True, dropna=False):
        values = dict(zip(keys, key, strict=True))
        for agg in aggs:
            values[agg.name] = agg.of(group[agg.on] if agg.on is not None else group)
        found.append(values)
    return pd.DataFrame(found)


def _sorted(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if rows.empty:
        return rows
    _columns(rows, keys)
    return rows.sort_values(keys, kind="mergesort", ignore_index=True)


def _through_groups(
    rows: pd.DataFrame,
    keys: list[str],
    index: int,
    n: int,
    fn: Callable[[Any], Any],
    batch_format: str,
) -> pd.DataFrame:
    """The groups of part ``index`` of ``n`` (a group is in the part where its first row
    falls), each through ``fn``."""
    import pandas as pd

    if rows.empty:
        return rows
    groups = rows.groupby(keys, sort=False, dropna=False).ngroup()
    starts = groups.drop_duplicates()  # the first row of each group, in order
    part_of = {
        g: min(n - 1, int(row) * n // len(rows))
        for row, g in zip(starts.index.to_numpy(), starts.to_numpy(), strict=True)
    }
    mine = rows[groups.map(part_of) == index]
    outs = [
        _blocks.frame(fn(_blocks.batch(group.reset_index(drop=True), batch_format)))
        for _, group in mine.groupby(keys, sort=False, dropna=False)
    ]
    return pd.concat(outs, ignore_index=True) if outs else pd.DataFrame()  # fn's columns unknown
