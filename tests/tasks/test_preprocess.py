"""Preprocessing: validation, a seeded split, train-only statistics, files written by Dask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from cifar.dataset import Dataset, read_split
from cifar.format import write_synthetic_archive
from cifar.preparation import channel_stats
from tasks.download import Archive
from tasks.layout import StorageLayout
from tasks.preprocess import preprocess_archive
from trainlib import DaskConfig


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, dask_client: Client) -> Dataset:
    root = tmp_path_factory.mktemp("prep")
    md5 = write_synthetic_archive(str(root / "a.tar.gz"), images_per_batch=40)
    return preprocess_archive(
        Archive(str(root / "a.tar.gz"), md5, True),
        StorageLayout.at(str(root / "store")),
        dask_config=DaskConfig(address=dask_client.scheduler.address),
        num_workers=2,
        batch_size=16,
        rows_per_file=50,
        val_fraction=0.1,
        seed=3,
    )


def test_preprocess_writes_files_and_manifest(dataset: Dataset) -> None:
    manifest = dataset.manifest
    assert (manifest.rows("train"), manifest.rows("val"), manifest.rows("test")) == (180, 20, 40)
    assert [f.rows for f in manifest.splits["train"]] == [50, 50, 50, 30]
    test = read_split(dataset, "test")
    assert test.images.shape == (40, 3, 32, 32) and test.images.dtype == np.uint8
    assert manifest.source_verified and len(manifest.mean) == 3


def test_preprocess_train_stats_exclude_validation_and_test(dataset: Dataset) -> None:
    train = read_split(dataset, "train")
    assert dataset.manifest.mean == pytest.approx(channel_stats(train.images)[0])


def test_preprocess_is_skipped_when_dataset_exists(dataset: Dataset) -> None:
    manifest_file = Path(dataset.uri, "manifest.json")
    before = manifest_file.stat().st_mtime_ns
    again = preprocess_archive(
        Archive("/nonexistent.tar.gz", dataset.manifest.source_md5, True),
        StorageLayout.at(str(Path(dataset.uri).parent.parent)),
        dask_config=DaskConfig(address="tcp://never-connected:1"),
        num_workers=2,
        batch_size=16,
        rows_per_file=50,
        val_fraction=0.1,
        seed=3,
    )
    assert again == dataset and manifest_file.stat().st_mtime_ns == before
