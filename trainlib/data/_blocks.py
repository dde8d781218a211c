"""What a ``Dataset``'s tasks do to one block (a pandas DataFrame, a tensor column holding one
array per row): rows and batches in Ray Data's formats, and back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trainlib.errors import ConfigError, DatasetError

if TYPE_CHECKING:
    import pandas as pd
    import torch
BATCH_FORMATS = ("default", "numpy", "pandas")
_INSTANCES: dict[str, Any] = {}  # a callable class's instance, one per process and transform
_INSTANCES_LOCK = threading.Lock()


def check_format(batch_format: str | None) -> str:
    """Ray's batch formats that trainlib has: ``default``/``numpy`` (a dict of arrays) and
    ``pandas``; None is ``default``."""
    batch_format = batch_format or "default"
    if batch_format not in BATCH_FORMATS:
        raise ConfigError(
            f"batch_format={batch_format!r}: trainlib's blocks are pandas DataFrames; use "
            "'numpy' (a dict of arrays, the default) or 'pandas'."
        )
    return batch_format


def frame(rows: Sequence[Mapping[str, Any]] | pd.DataFrame | Mapping[str, Any]) -> pd.DataFrame:
    """A block from rows, a DataFrame, or a batch (a dict of equal-length arrays)."""
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        return rows.reset_index(drop=True)
    if isinstance(rows, Mapping):  # a numpy batch: a column of arrays keeps one per row
        columns = {k: list(v) if np.ndim(v) > 1 else np.asarray(v) for k, v in rows.items()}
        return pd.DataFrame(columns)
    if not isinstance(rows, list) or not all(isinstance(row, Mapping) for row in rows):
        raise ConfigError(
            "A row transform must return a dict (column -> value); a batch transform a dict "
            f"of arrays or a pandas DataFrame, not {type(rows).__name__}."
        )
    return pd.DataFrame(list(rows))


def rows(block: pd.DataFrame) -> Iterator[dict[str, Any]]:
    """The block's rows as dicts."""
    columns = list(block.columns)
    for values in zip(*(block[c].to_numpy() for c in columns), strict=True):
        yield {str(c): plain(v) for c, v in zip(columns, values, strict=True)}


def batch(block: pd.DataFrame, batch_format: str) -> Any:
    """The block as a batch of ``batch_format``."""
    if batch_format == "pandas":
        return block.reset_index(drop=True)
    from trainlib._internal.common.datasets import frame_to_block

    return frame_to_block(block)


def instance(fn: Any, token: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """``fn`` itself, or for a callable class its instance in this process (constructed once
    per process and transform, as Ray constructs one per actor)."""
    if not isinstance(fn, type):
        return fn
    with _INSTANCES_LOCK:
        if token not in _INSTANCES:
            _INSTANCES[token] = fn(*args, **kwargs)
        return _INSTANCES[token]


def map_rows(block: pd.DataFrame, fn: Callable[..., Any], kind: str) -> pd.DataFrame:
    """``map`` (a row per row), ``flat_map`` (rows per row) or ``filter`` (a bool per row)."""
    import pandas as pd

    if kind == "filter":
        keep = [bool(fn(row)) for row in rows(block)]
        return block[np.asarray(keep, dtype=bool)].reset_index(drop=True) if keep else block
    out: list[Mapping[str, Any]] = []
    for row in rows(block):
        out.extend(fn(row) if kind == "flat_map" else [fn(row)])
    return frame(out) if out else pd.DataFrame()


def map_batches(
    block: pd.DataFrame, fn: Callable[..., Any], batch_size: int | None, batch_format: str
) -> pd.DataFrame:
    """``fn`` on each batch of ``batch_size`` rows of the block (the whole block with None)."""
    import pandas as pd

    size = batch_size or max(1, len(block))
    outs = [
        frame(fn(batch(block.iloc[start : start + size], batch_format)))
        for start in range(0, len(block), size)
    ]
    return pd.concat(outs, ignore_index=True) if outs else block


def plain(value: Any) -> Any:
    """A numpy scalar as Python's (as Ray's rows give them); arrays stay arrays."""
    return value.item() if isinstance(value, np.generic) else value


def tensor(column: str, values: np.ndarray, dtype: Any, device: str) -> torch.Tensor:
    import torch

    try:  # a read-only view is copied first
        return torch.as_tensor(np.require(values, requirements="W"), dtype=dtype).to(device)
    except TypeError as exc:
        raise DatasetError(
            f"Column {column!r} holds {values.dtype} values, which make no tensor ({exc}); "
            "drop it first (drop_columns) or pass collate_fn=."
        ) from None


def tensors(
    batch: Mapping[str, np.ndarray],
    dtypes: torch.dtype | Mapping[str, torch.dtype] | None,
    device: str,
) -> dict[str, torch.Tensor]:
    """A batch's columns as tensors of ``dtypes`` (one for all, or by column) on ``device``."""
    return {
        k: tensor(k, v, dtypes.get(k) if isinstance(dtypes, Mapping) else dtypes, device)
        for k, v in batch.items()
    }


def first_rows(blocks: Iterator[pd.DataFrame], limit: int | None) -> pd.DataFrame:
    """The blocks' rows as one DataFrame (empty blocks skipped); the first ``limit`` only
    (blocks read until there are) when given."""
    import pandas as pd

    parts, total, empty = [], 0, None
    for block in blocks:
        if not len(block):  # no rows: no say in the columns (a group-less part has none)
            empty = block if empty is None else empty
            continue
        parts.append(block)
        total += len(block)
        if limit is not None and total >= limit:
            break
    whole = pd.concat(parts, ignore_index=True) if parts else empty
    whole = pd.DataFrame() if whole is None else whole
    return whole if limit is None else whole.iloc[:limit]


def delayed(value: Any) -> Any:
    """``value`` (a function or a block) as a Dask delayed, a new task each call."""
    from dask.delayed import delayed as dask_delayed

    return dask_delayed(value, pure=False)


def concat(blocks: list[pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    return pd.concat(blocks, ignore_index=True) if blocks else pd.DataFrame()


def shuffled(rows: pd.DataFrame, seed: int | None) -> pd.DataFrame:
    return rows.sample(frac=1.0, random_state=np.random.default_rng(seed)).reset_index(drop=True)


def kept(rows: pd.DataFrame, seed: int | None) -> pd.DataFrame:
    return rows


def sorted_by(key: str | list[str], descending: bool) -> Callable[..., pd.DataFrame]:
    def order(rows: pd.DataFrame, seed: int | None) -> pd.DataFrame:
        return rows.sort_values(key, ascending=not descending, ignore_index=True)

    return order


def part(rows: pd.DataFrame, index: int, n: int) -> pd.DataFrame:
    bounds = np.linspace(0, len(rows), n + 1).astype(int)
    return rows.iloc[bounds[index] : bounds[index + 1]].reset_index(drop=True)


def write_block(block: pd.DataFrame, filesystem: Any, path: str, kind: str, kw: Any) -> None:
    with filesystem.open(path, "wb") as out:
        if kind == "parquet":
            block.to_parquet(out, **kw)
        else:
            out.write(block.to_csv(index=False, **kw).encode())


def writes(blocks: tuple[Any, ...], path: str, kind: str, kwargs: dict[str, Any]) -> list[Any]:
    """The tasks writing each block to its file under ``path`` (a folder or URL)."""
    import fsspec

    filesystem, root = fsspec.core.url_to_fs(path)
    filesystem.makedirs(root, exist_ok=True)
    return [
        delayed(write_block)(block, filesystem, f"{root}/{i:06d}.{kind}", kind, kwargs)
        for i, block in enumerate(blocks)
    ]
