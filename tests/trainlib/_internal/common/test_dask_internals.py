"""The installed Dask still has the internals trainlib uses (``dask_internals``): a Dask that
moved them fails here, loudly, rather than making ingest silently slower."""

from __future__ import annotations

from pathlib import Path

import dask
import dask.dataframe as dd
import pandas as pd
from dask.delayed import delayed

from trainlib._internal.common import dask_internals


def test_dask_has_task_specs_that_fuse_a_graph() -> None:
    spec = dask_internals.task_spec()
    assert spec is not None, f"dask {dask.__version__} has no dask._task_spec: see dask_internals"
    a = delayed(lambda: 2, pure=True)()
    b = delayed(lambda x: x * 3, pure=True)(a)
    graph = spec.convert_legacy_graph(dict(b.__dask_graph__()))
    fused = spec.fuse(*graph.values(), key=b.key)
    assert dask.get({b.key: fused}, b.key) == 6


def test_dask_knows_parquet_partition_lengths_without_reading(tmp_path: Path) -> None:
    for index, rows in enumerate((3, 5)):
        pd.DataFrame({"x": range(rows)}).to_parquet(tmp_path / f"part-{index}.parquet")
    frame = dd.read_parquet(str(tmp_path))
    assert dask_internals.known_lengths(frame) == (3, 5), (
        f"dask {dask.__version__} no longer gives Parquet partition lengths: see dask_internals"
    )
