"""trainlib.data's Dataset and constructors as Ray Data's: each way in, each transform and
each way out, against what pandas computes for the same rows (Dask's local threads here;
``test_ray_data_port_integration`` trains on one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import trainlib.data as data
from trainlib import ConfigError, DatasetError

ROWS = [{"x": i, "y": float(i * i), "name": f"r{i}"} for i in range(10)]


def test_constructors_give_ray_datas_rows(tmp_path: Path) -> None:
    assert data.range(3).take_all() == [{"id": 0}, {"id": 1}, {"id": 2}]
    assert data.from_items(ROWS).take_all() == ROWS
    assert data.from_items([1, "a"]).take_all() == [{"item": 1}, {"item": "a"}]
    frame = pd.DataFrame(ROWS)
    assert data.from_pandas([frame.iloc[:4], frame.iloc[4:]]).take_all() == ROWS
    arrays = np.arange(12).reshape(3, 2, 2)
    (first, *_) = data.from_numpy(arrays).take(1)
    assert np.array_equal(first["data"], arrays[0])
    assert data.from_numpy(arrays).take_batch(3)["data"].shape == (3, 2, 2)
    tensors = torch.utils.data.TensorDataset(torch.arange(4))
    assert [int(r["item"][0]) for r in data.from_torch(tensors).take_all()] == [0, 1, 2, 3]
    import dask.dataframe as dd

    assert data.from_dask(dd.from_pandas(frame, npartitions=3)).take_all() == ROWS


def test_files_read_one_block_each(tmp_path: Path) -> None:
    frame = pd.DataFrame(ROWS)
    (tmp_path / "csv").mkdir()
    frame.iloc[:5].to_csv(tmp_path / "csv" / "a.csv", index=False)
    frame.iloc[5:].to_csv(tmp_path / "csv" / "b.csv", index=False)
    (tmp_path / "csv" / "notes.txt").write_text("not data")
    csv = data.read_csv(str(tmp_path / "csv"))
    assert (csv.num_blocks(), csv.take_all()) == (2, ROWS)
    frame.to_parquet(tmp_path / "rows.parquet")
    parquet = data.read_parquet(str(tmp_path / "rows.parquet"), columns=["x", "name"])
    assert parquet.take_all() == [{"x": r["x"], "name": r["name"]} for r in ROWS]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    assert data.read_json(str(tmp_path / "rows.jsonl")).take_all() == ROWS
    with pytest.raises(DatasetError, match="does not exist"):
        data.read_csv(str(tmp_path / "missing"))
    with pytest.raises(DatasetError, match="No parquet files"):
        data.read_parquet(str(tmp_path / "csv"))


def test_read_images_gives_hwc_arrays_resized_and_converted(tmp_path: Path) -> None:
    colors = {"red.png": (255, 0, 0), "green.jpg": (0, 255, 0)}
    for name, color in colors.items():
        Image.new("RGB", (8, 6), color).save(tmp_path / name)
    rows = data.read_images(str(tmp_path), include_paths=True).take_all()
    assert sorted(Path(r["path"]).name for r in rows) == ["green.jpg", "red.png"]
    assert all(r["image"].shape == (6, 8, 3) and r["image"].dtype == np.uint8 for r in rows)
    small = data.read_images(str(tmp_path), size=(4, 2), mode="L").take_all()
    assert all(r["image"].shape == (4, 2) for r in small)


class AddOffset:
    """A callable class with constructor arguments, as Ray's map_batches takes one."""

    constructed = 0

    def __init__(self, offset: int) -> None:
        AddOffset.constructed += 1
        self.offset = offset

    def __call__(self, batch: dict[str, np.ndarray], scale: int = 1) -> dict[str, np.ndarray]:
        return {"x": (batch["x"] + self.offset) * scale}


def test_transforms_match_pandas() -> None:
    ds = data.from_items(ROWS, override_num_blocks=3)
    mapped = ds.map(lambda r: {**r, "z": r["x"] + r["y"]})
    assert [r["z"] for r in mapped.take_all()] == [i + i * i for i in range(10)]
    assert [r["x"] for r in ds.filter(lambda r: r["x"] % 3 == 0).take_all()] == [0, 3, 6, 9]
    twice = ds.flat_map(lambda r: [{"x": r["x"]}, {"x": -r["x"]}])
    assert twice.count() == 20 and twice.sum("x") == 0
    AddOffset.constructed = 0
    offset = ds.map_batches(
        AddOffset,
        fn_constructor_args=(100,),
        fn_kwargs={"scale": 2},
        batch_size=4,
        concurrency=2,
        compute=data.ActorPoolStrategy(size=2),
    )
    with dask.config.set(scheduler="threads"):  # here, whatever client another test made
        assert [r["x"] for r in offset.take_all()] == [(i + 100) * 2 for i in range(10)]
    assert AddOffset.constructed == 1  # once in this process, as once per actor
    as_pandas = ds.map_batches(lambda b: b[b["x"] > 6], batch_format="pandas", batch_size=None)
    assert [r["x"] for r in as_pandas.take_all()] == [7, 8, 9]
    columns = ds.add_column("w", lambda b: b["x"] * 2).drop_columns(["y"])
    assert columns.rename_columns({"w": "double"}).columns() == ["x", "name", "double"]
    assert ds.select_columns(["name"]).take(1) == [{"name": "r0"}]
    with pytest.raises(ConfigError, match="use 'numpy'"):
        ds.map_batches(lambda b: b, batch_format="pyarrow")


def test_reorderings_keep_every_row_once() -> None:
    ds = data.from_items(ROWS, override_num_blocks=4)
    shuffled = [r["x"] for r in ds.random_shuffle(seed=7).take_all()]
    assert sorted(shuffled) == list(range(10)) and shuffled != list(range(10))
    assert shuffled == [r["x"] for r in ds.random_shuffle(seed=7).take_all()]  # seeded
    assert ds.repartition(2).num_blocks() == 2 and ds.repartition(2).take_all() == ROWS
    assert [r["x"] for r in ds.sort("y", descending=True).take_all()] == list(range(9, -1, -1))
    parts = ds.split(3)
    assert sorted(r["x"] for p in parts for r in p.take_all()) == list(range(10))
    assert [p.count() for p in ds.split(3, equal=True)] == [3, 3, 3]
    train, test = ds.train_test_split(0.3)
    assert (train.count(), [r["x"] for r in test.take_all()]) == (7, [7, 8, 9])
    assert ds.limit(4).take_all() == ROWS[:4]
    assert ds.union(ds.limit(2)).count() == 12
    materialized = ds.map(lambda r: {"x": r["x"] * 10}).materialize()
    assert materialized.max("x") == 90 and materialized.min("x") == 0
    assert ds.mean("x") == 4.5 and sorted(ds.unique("x")) == list(range(10))


def test_consumption_as_ray_gives_it(capsys: pytest.CaptureFixture[str]) -> None:
    ds = data.from_items(ROWS, override_num_blocks=3)
    schema = ds.schema()
    assert schema.names == ["x", "y", "name"] and "Column" in str(schema)
    ds.show(2)
    assert capsys.readouterr().out.splitlines() == [str(ROWS[0]), str(ROWS[1])]
    batches = list(ds.iter_batches(batch_size=4))
    assert [len(b["x"]) for b in batches] == [4, 4, 2]
    assert [
        len(b) for b in ds.iter_batches(batch_size=4, batch_format="pandas", drop_last=True)
    ] == [4, 4]
    with pytest.raises(DatasetError, match="Column 'name' holds object values"):
        next(iter(ds.iter_torch_batches(batch_size=5)))
    numbers = ds.drop_columns(["name"])
    (first, *_) = numbers.iter_torch_batches(
        batch_size=5, dtypes={"x": torch.float32, "y": torch.float64}
    )
    assert first["x"].dtype == torch.float32 and first["y"].dtype == torch.float64
    collated = next(iter(ds.iter_torch_batches(batch_size=3, collate_fn=lambda b: b["x"].sum())))
    assert collated == 0 + 1 + 2
    assert [r["x"] for r in ds.iter_rows()] == list(range(10))
    assert ds.take_batch(3, batch_format="pandas")["name"].tolist() == ["r0", "r1", "r2"]
    assert ds.to_dask().compute().reset_index(drop=True).equals(pd.DataFrame(ROWS))


def test_written_files_read_back(tmp_path: Path) -> None:
    ds = data.from_items(ROWS, override_num_blocks=2)
    ds.write_parquet(str(tmp_path / "pq"))
    ds.write_csv(str(tmp_path / "csv"))
    assert len(list((tmp_path / "pq").iterdir())) == 2
    assert data.read_parquet(str(tmp_path / "pq")).take_all() == ROWS
    assert data.read_csv(str(tmp_path / "csv")).take_all() == ROWS


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(-1000, 1000), max_size=40),
    blocks=st.integers(1, 6),
    batch_size=st.one_of(st.none(), st.integers(1, 9)),
    map_size=st.one_of(st.none(), st.integers(1, 9)),
    drop_last=st.booleans(),
)
def test_batches_hold_every_row_in_order(
    values: list[int], blocks: int, batch_size: int | None, map_size: int | None, drop_last: bool
) -> None:
    """Whatever the blocks and batch sizes: a batch transform sees every row once in order,
    and iter_batches hands them out in full batches (the last one short unless dropped)."""
    ds = data.from_items([{"v": v} for v in values], override_num_blocks=blocks)
    doubled = ds.map_batches(lambda b: {"v": b["v"] * 2}, batch_size=map_size)
    got: list[Any] = []
    sizes = []
    for batch in doubled.iter_batches(batch_size=batch_size, drop_last=drop_last):
        got.extend(batch["v"].tolist())
        sizes.append(len(batch["v"]))
    expected = [v * 2 for v in values]
    if batch_size is None:
        assert got == expected
        return
    full = len(values) // batch_size * batch_size
    assert got == (expected[:full] if drop_last else expected)
    assert all(size == batch_size for size in sizes[: full // batch_size])
