"""Ray Data's aggregations (``ray.data.aggregate``): ``Count``, ``Sum``, ``Min``, ``Max``,
``Mean`` and ``Std`` for ``Dataset.aggregate`` and ``GroupedData.aggregate``, each computed by
pandas on the column it names; its result column is Ray's name (``sum(x)``, ``count()``) or
``alias_name``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.errors import DatasetError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["AggregateFn", "Count", "Max", "Mean", "Min", "Std", "Sum"]


@dataclass(frozen=True)
class AggregateFn:
    """An aggregation of the column ``on`` (of each group); ``ignore_nulls``: nulls skipped
    (else a null makes the result null)."""

    on: str | None = None
    ignore_nulls: bool = True
    alias_name: str | None = None
    kind = ""  # pandas' reduction

    @property
    def name(self) -> str:
        """The result's column: ``alias_name``, else Ray's ``kind(on)``."""
        return self.alias_name or f"{self.kind}({self.on or ''})"

    def columns(self) -> list[str]:
        """The columns the aggregation reads."""
        return [] if self.on is None else [self.on]

    def check(self, columns: list[str]) -> None:
        """Raises ``DatasetError`` when ``on`` is not one of the dataset's ``columns``."""
        if self.on is not None and self.on not in columns:
            raise DatasetError(
                f"{type(self).__name__}(on={self.on!r}): the dataset has no such column; its "
                f"columns are {columns}."
            )

    def of(self, values: pd.Series | pd.DataFrame) -> Any:
        """The aggregation of one group's ``values`` (its rows, for ``Count``)."""
        return getattr(values, self.kind)(skipna=self.ignore_nulls)


@dataclass(frozen=True)
class Count(AggregateFn):
    """Rows (of each group), nulls included, as Ray's ``Count()``."""

    kind = "count"

    def columns(self) -> list[str]:
        return []

    def of(self, values: pd.Series | pd.DataFrame) -> Any:
        return len(values)


@dataclass(frozen=True)
class Sum(AggregateFn):
    kind = "sum"

    def of(self, values: pd.Series | pd.DataFrame) -> Any:
        return values.sum(skipna=self.ignore_nulls, min_count=1)  # all null: null, as Ray


@dataclass(frozen=True)
class Min(AggregateFn):
    kind = "min"


@dataclass(frozen=True)
class Max(AggregateFn):
    kind = "max"


@dataclass(frozen=True)
class Mean(AggregateFn):
    kind = "mean"


@dataclass(frozen=True)
class Std(AggregateFn):
    """The standard deviation with ``ddof`` (Ray's default 1)."""

    ddof: int = 1
    kind = "std"

    def of(self, values: pd.Series | pd.DataFrame) -> Any:
        return values.std(ddof=self.ddof, skipna=self.ignore_nulls)
