"""A dataset on storage: Parquet files checked against their sha256, read as Dask arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cifar.dataset import (
    Dataset,
    Manifest,
    read_file,
    read_manifest,
    read_split,
    split_arrays,
    write_file,
    write_manifest,
)
from cifar.errors import CorruptDataError


def _dataset(root: Path) -> tuple[Dataset, np.ndarray]:
    images = np.random.default_rng(0).integers(0, 256, (7, 3, 32, 32), dtype=np.uint8)
    files = [
        write_file(str(root / "train-00000.parquet"), images[:4], np.arange(4)),
        write_file(str(root / "train-00001.parquet"), images[4:], np.arange(4, 7)),
    ]
    manifest = Manifest("md5", True, ("a",) * 10, (0.5,) * 3, (0.2,) * 3, 0.1, 0, {"train": files})
    write_manifest(str(root), manifest)
    return Dataset(str(root), manifest), images


def test_dataset_round_trip_through_parquet(tmp_path: Path) -> None:
    dataset, images = _dataset(tmp_path)
    assert read_manifest(str(tmp_path)) == dataset.manifest
    split = read_split(dataset, "train")
    assert np.array_equal(split.images, images) and split.labels.tolist() == list(range(7))
    assert dataset.manifest.rows("train") == 7


def test_dataset_split_arrays_have_one_chunk_per_file(tmp_path: Path) -> None:
    dataset, images = _dataset(tmp_path)
    arrays = split_arrays(dataset, "train")
    assert arrays["image"].chunks[0] == (4, 3) and arrays["label"].chunks[0] == (4, 3)
    assert np.array_equal(arrays["image"].compute(), images)


def test_dataset_corrupt_file_is_refused(tmp_path: Path) -> None:
    dataset, _ = _dataset(tmp_path)
    entry = dataset.manifest.splits["train"][1]
    path = tmp_path / entry.file
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CorruptDataError, match=r"train-00001\.parquet .* is corrupt"):
        read_file(str(tmp_path), entry)


def test_dataset_without_manifest_is_not_there(tmp_path: Path) -> None:
    assert read_manifest(str(tmp_path)) is None
