"""A dataset's columns and their types (Ray Data's ``Schema``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Schema:
    """A dataset's column names and their types (numpy dtypes; ``object`` for a tensor
    column, whose rows are arrays)."""

    names: list[str]
    types: list[Any]

    def __str__(self) -> str:
        width = max([len("Column"), *(len(n) for n in self.names)])
        lines = [f"{'Column':<{width}}  Type", f"{'-' * 6:<{width}}  ----"]
        lines += [f"{n:<{width}}  {t}" for n, t in zip(self.names, self.types, strict=True)]
        return "\n".join(lines)
