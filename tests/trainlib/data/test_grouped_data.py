"""Ray Data's groupby, aggregations and the other readers (text, binary files, NumPy, Arrow):
generated datasets cut into any number of blocks give what pandas computes for the same rows,
and Ray's own snippets run with ``import ray`` swapped for trainlib (Dask's local threads)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trainlib.data as data
from trainlib import DatasetError
from trainlib.data.aggregate import Count, Max, Mean, Min, Std, Sum

_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "k": st.sampled_from(["a", "b", "c", "d"]),
            "j": st.integers(0, 2),
            "v": st.integers(-50, 50),
            "f": st.floats(-10, 10, allow_nan=False) | st.just(float("nan")),
        }
    ),
    min_size=1,
    max_size=40,
)


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return (math.isnan(left) and math.isnan(right)) or math.isclose(left, right, abs_tol=1e-9)
    return bool(left == right)


@settings(max_examples=80, deadline=None)
@given(rows=_ROWS, blocks=st.integers(1, 6), two_keys=st.booleans())
def test_grouped_aggregations_match_pandas(rows, blocks, two_keys) -> None:
    keys = ["k", "j"] if two_keys else ["k"]
    frame = pd.DataFrame(rows)
    ds = data.from_items(rows, override_num_blocks=blocks)
    grouped = ds.groupby(keys if two_keys else "k")
    got = grouped.aggregate(
        Count(), Sum("v"), Min("f"), Max("v"), Mean("f"), Std("v", alias_name="spread")
    ).take_all()
    expected = frame.groupby(keys, sort=True)
    assert [tuple(row[k] for k in keys) for row in got] == [key for key, _ in expected]
    for row, (_, group) in zip(got, expected, strict=True):
        assert row["count()"] == len(group)
        assert row["sum(v)"] == group["v"].sum() and row["max(v)"] == group["v"].max()
        assert _same(row["min(f)"], float(group["f"].min()))
        assert _same(row["mean(f)"], float(group["f"].mean()))
        assert _same(row["spread"], float(group["v"].std(ddof=1)))
    by_sum = grouped.sum(["v", "f"]).take_all()
    assert [r["sum(v)"] for r in by_sum] == list(expected["v"].sum())


@settings(max_examples=60, deadline=None)
@given(rows=_ROWS, blocks=st.integers(1, 6), batch_format=st.sampled_from(["pandas", "numpy"]))
def test_map_groups_sees_each_group_whole_once(rows, blocks, batch_format) -> None:
    """However the rows are cut into blocks, ``fn`` gets each group once with all its rows, in
    key order, and may return any number of rows."""

    def summary(group: Any) -> Any:
        keys, values = np.asarray(group["k"]), np.asarray(group["v"])
        assert len(set(keys)) == 1
        return {"k": keys[:1], "n": [len(values)], "total": [int(values.sum())]}

    ds = data.from_items(rows, override_num_blocks=blocks)
    result = ds.groupby("k").map_groups(summary, batch_format=batch_format)
    assert result.num_blocks() == ds.num_blocks()
    expected = pd.DataFrame(rows).groupby("k", sort=True)["v"]
    assert result.take_all() == [{"k": k, "n": len(g), "total": int(g.sum())} for k, g in expected]


def test_grouped_data_refuses_what_it_cannot_take() -> None:
    ds = data.from_items([{"k": 1, "v": 2}])
    for key in (None, [], ["k", 3], lambda row: row["k"]):
        with pytest.raises(DatasetError, match="give a column name or a list of them"):
            ds.groupby(key)  # type: ignore[arg-type]
    with pytest.raises(DatasetError, match="no column 'w'; its columns are"):
        ds.groupby("k").sum("w").take_all()
    with pytest.raises(DatasetError, match="takes one or more aggregations"):
        ds.groupby("k").aggregate()
    assert ds.aggregate(Count(), Sum("v")) == {"count()": 1, "sum(v)": 2}
    assert data.from_items([{"k": 1, "v": 2}, {"k": 1, "v": 4}]).std("v") == pytest.approx(
        math.sqrt(2)
    )


def test_other_readers_give_ray_datas_rows(tmp_path: Path) -> None:
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("first\n\nsecond\n")
    (tmp_path / "text" / "b.txt").write_text("third\n")
    text = data.read_text(str(tmp_path / "text"))
    assert text.take_all() == [{"text": "first"}, {"text": "second"}, {"text": "third"}]
    kept = data.read_text(str(tmp_path / "text" / "a.txt"), drop_empty_lines=False)
    assert [r["text"] for r in kept.take_all()] == ["first", "", "second"]
    binary = data.read_binary_files(str(tmp_path / "text"), include_paths=True).take_all()
    assert [(r["bytes"], Path(r["path"]).name) for r in binary] == [
        (b"first\n\nsecond\n", "a.txt"),
        (b"third\n", "b.txt"),
    ]
    np.save(tmp_path / "x.npy", np.arange(6).reshape(3, 2))
    rows = data.read_numpy(str(tmp_path / "x.npy")).take_all()
    assert [list(r["data"]) for r in rows] == [[0, 1], [2, 3], [4, 5]]
    table = pa.table({"a": [1, 2], "b": ["x", "y"]})
    assert (
        data.from_arrow([table, table]).take_all()
        == [
            {"a": 1, "b": "x"},
            {"a": 2, "b": "y"},
        ]
        * 2
    )


# Ray Data's ``Dataset.groupby`` example (python/ray/data/dataset.py, its testcode), then the
# "Transforming groups" NumPy snippet, as written there but for the download: iris.parquet is a
# local file of the same columns. Ray's first snippet is lazy as written and raises when read
# (pandas' ``drop("variety")`` looks for a row label); so does trainlib's.
RAY_GROUPBY_EXAMPLES = """
import pandas as pd
import ray

def normalize_variety(group: pd.DataFrame) -> pd.DataFrame:
    for feature in group.drop("variety").columns:
        group[feature] = group[feature] / group[feature].abs().max()
    return group

ds = (
    ray.data.read_parquet("s3://anonymous@ray-example-data/iris.parquet")
    .groupby("variety")
    .map_groups(normalize_variety, batch_format="pandas")
)

from typing import Dict
import numpy as np
import ray

items = [
    {"image": np.zeros((32, 32, 3)), "label": label}
    for _ in range(10) for label in range(100)
]

def normalize_images(group: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    group["image"] = (group["image"] - group["image"].mean()) / group["image"].std()
    return group

ds2 = (
    ray.data.from_items(items)
    .groupby("label")
    .map_groups(normalize_images)
)
"""


def test_ray_data_groupby_examples_run_with_imports_swapped(tmp_path: Path) -> None:
    iris = pd.DataFrame(
        {
            "sepal.length": [5.1, 4.9, 7.0, 6.4],
            "petal.width": [0.2, 0.4, 1.4, 1.5],
            "variety": ["Setosa", "Setosa", "Versicolor", "Versicolor"],
        }
    )
    iris.to_parquet(tmp_path / "iris.parquet")
    source = RAY_GROUPBY_EXAMPLES.replace(
        "import ray\n", "import trainlib as ray\nimport trainlib.data\n"
    )
    source = source.replace(
        "s3://anonymous@ray-example-data/iris.parquet", str(tmp_path / "iris.parquet")
    )
    scope: dict[str, Any] = {}
    exec(compile(source, "ray_groupby_examples.py", "exec"), scope)
    with pytest.raises(KeyError, match="variety"):  # as in Ray, once the rows are read
        scope["ds"].take_all()
    images = scope["ds2"]
    assert images.count() == 1000
    first = images.take(20)
    assert {r["label"] for r in first} == {0, 1}  # groups in key order, ten rows each
    assert all(r["image"].shape == (32, 32, 3) for r in first)
    # the normalisation Ray's first snippet means, on the same groups
    fixed = (
        data.read_parquet(str(tmp_path / "iris.parquet"))
        .groupby("variety")
        .map_groups(
            lambda g: g.assign(
                **{"sepal.length": g["sepal.length"] / g["sepal.length"].abs().max()}
            ),
            batch_format="pandas",
        )
    )
    assert [r["sepal.length"] for r in fixed.take_all()] == pytest.approx(
        [1.0, 4.9 / 5.1, 1.0, 6.4 / 7.0]
    )
