from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from tasks.cifar import Batch, write_synthetic_archive
from tasks.preprocess import (
    channel_stats,
    preprocess_archive,
    read_manifest,
    read_shard,
    split_validation,
)
from trainlib import DaskConfig


def test_preprocess_split_is_seeded_disjoint_and_complete() -> None:
    batch = Batch(np.zeros((100, 3, 32, 32), np.uint8), np.arange(100))
    train, val = split_validation(batch, 0.2, seed=7)
    again, _ = split_validation(batch, 0.2, seed=7)
    assert len(val.labels) == 20 and len(train.labels) == 80
    assert set(train.labels) | set(val.labels) == set(range(100))
    assert np.array_equal(train.labels, again.labels)
    other, _ = split_validation(batch, 0.2, seed=8)
    assert not np.array_equal(train.labels, other.labels)


def test_preprocess_channel_stats_per_channel() -> None:
    images = np.zeros((4, 3, 2, 2), np.uint8)
    images[:, 1] = 255
    images[:2, 2] = 255
    mean, std = channel_stats(images)
    assert mean == pytest.approx((0.0, 1.0, 0.5))
    assert std == pytest.approx((0.0, 0.0, 0.5))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, dask_client: Client) -> str:
    root = tmp_path_factory.mktemp("prep")
    md5 = write_synthetic_archive(str(root / "a.tar.gz"), images_per_batch=40)
    return preprocess_archive(
        str(root / "a.tar.gz"),
        md5,
        True,
        str(root / "store"),
        val_fraction=0.1,
        seed=3,
        shard_size=50,
        dask=DaskConfig(address=dask_client.scheduler.address),
    )


def test_preprocess_writes_shards_and_manifest(dataset: str) -> None:
    manifest = read_manifest(dataset)
    assert (manifest.count("train"), manifest.count("val"), manifest.count("test")) == (180, 20, 40)
    assert [s.count for s in manifest.splits["train"]] == [50, 50, 50, 30]
    shard = read_shard(dataset, manifest.splits["test"][0])
    assert shard.images.shape == (40, 3, 32, 32) and shard.images.dtype == np.uint8
    assert manifest.source_verified and len(manifest.mean) == 3


def test_preprocess_train_stats_exclude_validation_and_test(dataset: str) -> None:
    manifest = read_manifest(dataset)
    train = np.concatenate([read_shard(dataset, s).images for s in manifest.splits["train"]])
    assert manifest.mean == pytest.approx(channel_stats(train)[0])


def test_preprocess_is_skipped_when_dataset_exists(dataset: str, dask_client: Client) -> None:
    manifest_file = Path(dataset, "manifest.json")
    before = manifest_file.stat().st_mtime_ns
    store = str(Path(dataset).parent.parent)
    again = preprocess_archive(
        "/nonexistent.tar.gz",
        read_manifest(dataset).source_md5,
        True,
        store,
        val_fraction=0.1,
        seed=3,
        shard_size=50,
    )
    assert again == dataset and manifest_file.stat().st_mtime_ns == before


def test_preprocess_detects_corrupt_shard(dataset: str) -> None:
    manifest = read_manifest(dataset)
    shard = manifest.splits["val"][0]
    path = Path(dataset, shard.file)
    original = path.read_bytes()
    try:
        path.write_bytes(original[:-10] + b"0123456789")
        with pytest.raises(ValueError, match="corrupt"):
            read_shard(dataset, shard)
    finally:
        path.write_bytes(original)
    assert json.loads(Path(dataset, "manifest.json").read_text())["seed"] == 3
