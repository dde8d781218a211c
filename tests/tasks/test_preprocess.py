"""Preprocessing: validation, a seeded split, train-only statistics, files written by Dask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from cifar.dataset import Dataset, content_digest, read_manifest, read_split
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


@pytest.mark.parametrize("rows_per_file", [7, 13])
def test_preprocess_digests_the_images_not_the_files(
    dataset: Dataset, dask_client: Client, tmp_path: Path, rows_per_file: int
) -> None:
    """Cut into other files, the same images keep their digests (the promotion ledger's key of
    the test split), and each digest is that of the decoded images and labels."""
    archive = Path(dataset.uri).parent.parent.parent / "a.tar.gz"
    recut = preprocess_archive(
        Archive(str(archive), dataset.manifest.source_md5, True),
        StorageLayout.at(str(tmp_path / "store")),
        dask_config=DaskConfig(address=dask_client.scheduler.address),
        num_workers=2,
        batch_size=16,
        rows_per_file=rows_per_file,
        val_fraction=0.1,
        seed=3,
    )
    assert recut.manifest.splits["test"] != dataset.manifest.splits["test"]  # other files
    assert recut.manifest.digest("test") == dataset.manifest.digest("test")
    assert recut.manifest.digest() == dataset.manifest.digest()
    test = read_split(recut, "test")
    assert recut.manifest.contents["test"] == content_digest(test.images, test.labels)
    relabelled = content_digest(test.images, np.roll(test.labels, 1))
    assert relabelled != recut.manifest.contents["test"]


def test_a_manifest_without_content_digests_is_rebuilt(dataset: Dataset, tmp_path: Path) -> None:
    """A dataset written before manifests kept content digests counts as not written."""
    raw = json.loads(Path(dataset.uri, "manifest.json").read_text())
    del raw["contents"]
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    assert read_manifest(str(tmp_path)) is None
