"""The two parts of Dask that trainlib uses without a public API, in one place.

- **Task specs** (``dask._task_spec``): to run each block of a dataset as one fused task over
  only what it needs (``datasets._fused``). Dask's public ``optimize`` keeps whole partitions'
  worth of tasks in each block, and the scheduler's work per task, not the file read, then
  limits a streamed pass (benchmarks/ingest.py).
- **dask-expr's ``Lengths``** (``dask.dataframe.dask_expr._expr``): a DataFrame's partition
  lengths from its Parquet metadata, without reading the data. Public ``map_partitions(len)``
  reads every file.

Each is optional: on a Dask where it moved, trainlib falls back (blocks as ``optimize`` culls
them; rows counted as the data streams), slower but correct. The tests of this module
(``tests/trainlib/_internal/common/test_dask_internals.py``) fail on such a Dask, so that an
upgrade is noticed and this module updated, not silently slower.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class TaskSpec(NamedTuple):
    """What ``datasets._fused`` needs of ``dask._task_spec``."""

    convert_legacy_graph: Any
    fuse: Any  # Task.fuse


def task_spec() -> TaskSpec | None:
    """Dask's task-spec functions, or None on a Dask without them."""
    try:
        from dask._task_spec import Task, convert_legacy_graph
    except ImportError:
        return None
    return TaskSpec(convert_legacy_graph, Task.fuse)


def known_lengths(frame: Any) -> tuple[int, ...] | None:
    """The partition lengths of a Dask DataFrame that Dask knows without computing (Parquet
    metadata), else None (also on a Dask without dask-expr's ``Lengths``)."""
    try:
        from dask.dataframe.dask_expr._expr import Lengths, Literal
    except ImportError:
        return None
    known = Lengths(frame.expr).optimize()
    return tuple(int(n) for n in known.value) if isinstance(known, Literal) else None
