"""The Dask collections of ``TorchTrainer(datasets=...)``, as partitions the feeders compute.

Each partition becomes a *block*: a dict of column name -> numpy array with the same number of
rows. A DataFrame column of fixed-shape arrays or tensors (an image column) becomes one stacked
array. Blocks are computed by Dask tasks on the cluster's workers, never in a rank process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.base import optimize
from dask.delayed import Delayed, delayed
from dask.highlevelgraph import HighLevelGraph

from trainlib._internal.common import dask_internals
from trainlib.data_config import DataConfig
from trainlib.errors import ConfigError, DatasetError

Block = dict[str, np.ndarray]


@dataclass(frozen=True)
class DatasetSource:
    """One dataset: a lazy block per partition, and the row counts if known without work."""

    name: str
    partitions: tuple[Delayed, ...]
    split: bool
    lengths: tuple[int, ...] | None


def sources_from(datasets: Mapping[str, Any], config: DataConfig) -> dict[str, DatasetSource]:
    """Check the user's collections and turn each into a ``DatasetSource``.

    Raises:
        ConfigError: A dataset is not a Dask DataFrame or a dict of Dask arrays, or
            ``DataConfig.datasets_to_split`` names a dataset that was not given.
    """
    unknown = set(config.split_names(datasets)) - set(datasets)
    if unknown:
        raise ConfigError(
            f"DataConfig(datasets_to_split={sorted(unknown)}) names datasets that "
            f"TorchTrainer(datasets=...) does not have; it has {sorted(datasets)}."
        )
    split = set(config.split_names(datasets))
    return {name: _source(name, value, name in split) for name, value in datasets.items()}


def _source(name: str, value: Any, split: bool) -> DatasetSource:
    import dask.array as da
    import dask.dataframe as dd

    if isinstance(value, dd.DataFrame):
        parts = value.to_delayed(optimize_graph=True)
        blocks = tuple(delayed(frame_to_block, pure=True)(part) for part in parts)
        return DatasetSource(name, blocks, split, dask_internals.known_lengths(value))
    frames = getattr(value, "frame_partitions", None)  # trainlib.data.Dataset, Ray Data's
    if callable(frames):
        blocks = tuple(delayed(frame_to_block, pure=True)(part) for part in frames())
        return DatasetSource(name, blocks, split, None)
    arrays = isinstance(value, Mapping) and all(isinstance(a, da.Array) for a in value.values())
    if arrays and value:
        return _array_source(name, dict(value), split)
    if isinstance(value, da.Array):
        raise ConfigError(
            f"datasets[{name!r}] is one dask array; name its column: "
            f"datasets={{{name!r}: {{'x': array}}}} (a batch is then {{'x': tensor}})."
        )
    raise ConfigError(
        f"datasets[{name!r}] is of type {type(value).__name__}; give a trainlib.data.Dataset "
        "(e.g. trainlib.data.read_parquet(...)), a dask.dataframe.DataFrame or a dict of dask "
        "arrays with the same number of rows, e.g. "
        '{"image": da.Array (N, 3, 32, 32), "label": da.Array (N,)}.'
    )


def _array_source(name: str, arrays: dict[str, Any], split: bool) -> DatasetSource:
    first = next(iter(arrays.values()))
    lengths = {column: array.shape[0] for column, array in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ConfigError(
            f"datasets[{name!r}] holds arrays of different lengths {lengths}; every array of a "
            "dataset needs one entry per row."
        )
    rows = first.chunks[0]
    per_array = []
    for array in arrays.values():
        # one chunk across every axis but the first, and the first array's row chunks
        chunks = {0: rows, **{axis: -1 for axis in range(1, array.ndim)}}
        # Not optimized array by array: that renames the tasks the arrays share (the read of a
        # file holding both images and labels) apart, and each was computed once per array.
        per_array.append(array.rechunk(chunks).to_delayed(optimize_graph=False).ravel())
    names = tuple(arrays)
    blocks = [
        delayed(arrays_to_block, pure=True)(names, *(chunks[i] for chunks in per_array))
        for i in range(len(rows))
    ]
    known = None if any(np.isnan(n) for n in rows) else tuple(int(n) for n in rows)
    return DatasetSource(name, _fused(blocks), split, known)


def _fused(blocks: list[Delayed]) -> tuple[Delayed, ...]:
    """Each block as one task over only what it needs, tasks shared between blocks kept apart.

    ``optimize`` left a block with the tasks of every later partition (108 of 123 tasks for the
    4th of 24 files of ``cifar.dataset.split_arrays``) and each task of a block is scheduled on
    its own: the scheduler's work per partition, not the file read, limited a streamed pass
    (benchmarks/ingest.py). Here the graph is built once; a block's tasks that no other block
    needs run as one task (``Task.fuse``), and a task two blocks share (a file read across a
    row chunk boundary) stays a task of its own, computed once for both.
    """
    spec = dask_internals.task_spec()
    if spec is None:  # a Dask without task specs: every block's tasks as optimize culls them
        return tuple(optimize(block)[0] for block in blocks)
    graph: dict[Any, Any] = spec.convert_legacy_graph(
        dict(HighLevelGraph.merge(*(block.dask for block in blocks)))
    )
    needs = [_needed(graph, block.key) for block in blocks]
    users: dict[Any, int] = {}
    for keys in needs:
        for key in keys:
            users[key] = users.get(key, 0) + 1
    fused = []
    for block, keys in zip(blocks, needs, strict=True):
        own = [graph[k] for k in keys if users[k] == 1]
        shared = {k: graph[k] for k in keys if users[k] > 1}
        fused.append(Delayed(block.key, {**shared, block.key: spec.fuse(*own, key=block.key)}))
    return tuple(fused)


def _needed(graph: Mapping[Any, Any], key: Any) -> list[Any]:
    """The keys of ``graph`` that computing ``key`` needs, ``key`` included."""
    found, stack = {key}, [key]
    while stack:
        for dependency in graph[stack.pop()].dependencies:
            if dependency in graph and dependency not in found:
                found.add(dependency)
                stack.append(dependency)
    return list(found)


def check_rows(source: DatasetSource, world_size: int, client: Any) -> None:
    """Raise if a split dataset has fewer rows than ranks (counts partitions until enough).

    Raises:
        DatasetError: Fewer rows than ``world_size``.
    """
    if not source.split:
        return
    total = 0
    if source.lengths is not None:
        total = sum(source.lengths)
    else:
        for partition in source.partitions:
            total += client.compute(delayed(num_rows, pure=True)(partition)).result()
            if total >= world_size:
                return
    if total < world_size:
        raise DatasetError(
            f"datasets[{source.name!r}] has {total} rows for {world_size} ranks, and every rank "
            "needs at least one; use fewer workers (ScalingConfig(num_workers=...)) or more data."
        )


def frame_to_block(frame: Any) -> Block:
    """A pandas DataFrame as a block; a column of equal-shape arrays or tensors is stacked."""
    return {str(column): _column(frame[column]) for column in frame.columns}


def arrays_to_block(names: tuple[str, ...], *chunks: np.ndarray) -> Block:
    """The row chunks of a dict of arrays as a block."""
    return dict(zip(names, (np.asarray(c) for c in chunks), strict=True))


def num_rows(block: Block) -> int:
    """Rows in a block."""
    return len(next(iter(block.values()))) if block else 0


def take_rows(block: Block, start: int, stop: int) -> Block:
    """Rows ``start:stop`` of a block (run where the block is, so only they travel)."""
    return {column: values[start:stop] for column, values in block.items()}


def _column(series: Any) -> np.ndarray:
    values = series.to_numpy()
    if values.dtype != object or len(values) == 0:
        return values
    first = values[0]
    if hasattr(first, "shape") and all(getattr(v, "shape", None) == first.shape for v in values):
        return np.stack([np.asarray(v) for v in values])
    return values
