from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cifar.models import build_model
from mlops.evaluation import score
from tasks.predict import read_inputs, write_predictions


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(folder / "a.png")
    Image.fromarray(np.zeros((64, 48, 3), np.uint8)).save(folder / "sub" / "b.jpg")
    (folder / "broken.png").write_bytes(b"not an image")
    (folder / "notes.txt").write_text("ignored")
    return folder


def test_predict_reads_folder_and_lists_unreadable_images(tmp_path: Path) -> None:
    inputs = read_inputs(str(_folder(tmp_path)))
    assert [Path(n).name for n in inputs.names] == ["a.png", "b.jpg"]
    assert inputs.images.shape == (2, 3, 32, 32)
    assert int(inputs.images[0].mean()) == 200
    assert [Path(f).name for f, _ in inputs.errors] == ["broken.png"]


def test_predict_reads_cifar_batch(tmp_path: Path) -> None:
    batch = {"data": np.zeros((4, 3072), np.uint8), "labels": [0, 1, 2, 3]}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(batch, protocol=2))
    inputs = read_inputs(str(tmp_path / "test_batch"))
    assert inputs.names == [f"test_batch[{i}]" for i in range(4)]
    assert inputs.errors == []


def test_predict_missing_input_says_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No PNG or JPEG images under"):
        read_inputs(str(tmp_path))


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_predict_writes_table_and_errors_file(tmp_path: Path, suffix: str) -> None:
    inputs = read_inputs(str(_folder(tmp_path)))
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    probabilities = score(model, inputs.images)
    output = str(tmp_path / "out" / f"predictions.{suffix}")
    summary = write_predictions(inputs, probabilities, output, "m", "3")
    table = pd.read_parquet(output) if suffix == "parquet" else pd.read_csv(output)
    assert len(table) == summary.num_scored == 2
    assert np.allclose(table.filter(like="prob_").sum(axis=1), 1.0, atol=1e-5)
    assert set(table["model_version"].astype(str)) == {"3"}
    assert summary.errors_uri is not None
    assert pd.read_csv(summary.errors_uri)["file"].str.endswith("broken.png").all()
