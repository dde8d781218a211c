"""Dask collections as datasets: blocks, stacking, and the errors for what cannot be one."""

from __future__ import annotations

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch
from distributed import Client

from trainlib import ConfigError, DataConfig, DatasetError
from trainlib._internal.common.datasets import (
    arrays_to_block,
    check_rows,
    frame_to_block,
    sources_from,
    take_rows,
)


def test_datasets_frame_column_of_equal_shape_arrays_is_stacked() -> None:
    frame = pd.DataFrame(
        {
            "label": [1, 2],
            "image": [np.zeros((3, 2, 2), np.uint8), np.ones((3, 2, 2), np.uint8)],
            "tensor": [torch.zeros(4), torch.ones(4)],
            "ragged": [np.zeros(2), np.zeros(3)],
        }
    )
    block = frame_to_block(frame)
    assert block["image"].shape == (2, 3, 2, 2) and block["image"].dtype == np.uint8
    assert block["tensor"].shape == (2, 4)
    assert block["label"].tolist() == [1, 2]
    assert block["ragged"].dtype == object


def test_datasets_array_chunks_become_blocks_with_known_lengths() -> None:
    image = da.zeros((10, 3, 4, 4), dtype=np.uint8, chunks=(4, 3, 2, 2))
    label = da.arange(10, chunks=5)  # other row chunks: rechunked to the first array's
    (source,) = sources_from({"train": {"image": image, "label": label}}, DataConfig()).values()
    assert source.lengths == (4, 4, 2) and source.split
    block = source.partitions[1].compute()
    assert block["image"].shape == (4, 3, 4, 4) and block["label"].tolist() == [4, 5, 6, 7]
    assert take_rows(arrays_to_block(("a",), np.arange(5)), 1, 3)["a"].tolist() == [1, 2]


def test_datasets_parquet_lengths_come_from_metadata(tmp_path: object) -> None:
    frame = pd.DataFrame({"x": np.arange(30)})
    path = f"{tmp_path}/data"
    dd.from_pandas(frame, npartitions=3).to_parquet(path)
    (source,) = sources_from({"v": dd.read_parquet(path)}, DataConfig()).values()
    assert source.lengths == (10, 10, 10)


def test_datasets_wrong_type_names_what_works() -> None:
    with pytest.raises(ConfigError, match=r"\[.train.\] is of type list; give a trainlib.data"):
        sources_from({"train": [1, 2, 3]}, DataConfig())


def test_one_dask_array_is_told_to_name_its_column() -> None:
    import dask.array as da

    with pytest.raises(ConfigError, match=r"is one dask array; name its column: .*'x': array"):
        sources_from({"train": da.zeros((8, 2), chunks=4)}, DataConfig())


def test_datasets_unknown_split_name_is_refused() -> None:
    frame = dd.from_pandas(pd.DataFrame({"x": [1]}), npartitions=1)
    with pytest.raises(ConfigError, match=r"datasets_to_split=\['trian'\]"):
        sources_from({"train": frame}, DataConfig(datasets_to_split=["trian"]))


def test_datasets_arrays_of_different_lengths_are_refused() -> None:
    arrays = {"a": da.zeros(4, chunks=2), "b": da.zeros(5, chunks=2)}
    with pytest.raises(ConfigError, match="arrays of different lengths"):
        sources_from({"train": arrays}, DataConfig())


def test_datasets_fewer_rows_than_ranks_is_one_clear_error(dask_client: Client) -> None:
    frame = dd.from_pandas(pd.DataFrame({"x": [1]}), npartitions=1).map_partitions(lambda f: f)
    (source,) = sources_from({"train": frame}, DataConfig()).values()
    with pytest.raises(DatasetError, match="has 1 rows for 2 ranks"):
        check_rows(source, 2, dask_client)


def test_data_config_split_names_and_validation() -> None:
    assert DataConfig().split_names(["a", "b"]) == ["a", "b"]
    assert DataConfig(datasets_to_split=["a"]).split_names(["a", "b"]) == ["a"]
    with pytest.raises(ConfigError, match=r"must be 'all' or a list"):
        DataConfig(datasets_to_split="train")


def test_datasets_array_blocks_are_one_task_each_and_shared_tasks_stay_shared() -> None:
    image = da.arange(12, chunks=4).reshape(12, 1)
    aligned = sources_from({"t": {"image": image, "label": da.arange(12, chunks=4)}}, DataConfig())
    assert [len(p.dask) for p in aligned["t"].partitions] == [1, 1, 1]
    # label chunk 3:9 feeds two blocks: it stays a task of its own, in both blocks' graphs
    crossing = {"image": image, "label": da.arange(12, chunks=(3, 6, 3))}
    (source,) = sources_from({"t": crossing}, DataConfig()).values()
    blocks = [p.compute(scheduler="sync") for p in source.partitions]
    assert [b["label"].tolist() for b in blocks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert set(source.partitions[0].dask) & set(source.partitions[1].dask)
