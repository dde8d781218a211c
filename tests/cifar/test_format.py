from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from cifar.format import (
    ARCHIVE_DIR,
    CLASS_NAMES,
    META,
    DataFormatError,
    parse_batch,
    parse_meta,
    synthetic_batch,
    write_synthetic_archive,
)


def _pickled(value: object) -> bytes:
    return pickle.dumps(value, protocol=2)


def test_cifar_synthetic_archive_has_the_official_layout(tmp_path: Path) -> None:
    md5 = write_synthetic_archive(str(tmp_path / "a.tar.gz"), images_per_batch=20)
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        names = sorted(tar.getnames())
        batch = parse_batch(tar.extractfile(f"{ARCHIVE_DIR}/data_batch_3").read(), "b3")
        meta = parse_meta(tar.extractfile(f"{ARCHIVE_DIR}/{META}").read())
    assert names == sorted(
        f"{ARCHIVE_DIR}/{n}"
        for n in [META, "test_batch", *(f"data_batch_{i}" for i in range(1, 6))]
    )
    assert batch.images.shape == (20, 3, 32, 32) and batch.images.dtype == np.uint8
    assert meta == CLASS_NAMES
    assert len(md5) == 32


def test_cifar_synthetic_archive_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    first = write_synthetic_archive(str(tmp_path / "first.tar.gz"), images_per_batch=20)
    (tmp_path / "later").mkdir()  # another name and another moment: gzip kept both
    again = write_synthetic_archive(str(tmp_path / "later" / "x.tar.gz"), images_per_batch=20)
    assert again == first
    assert (tmp_path / "later" / "x.tar.gz").read_bytes() == (
        tmp_path / "first.tar.gz"
    ).read_bytes()
    assert write_synthetic_archive(str(tmp_path / "other.tar.gz"), 20, seed=1) != first


def test_cifar_synthetic_classes_differ_in_mean_image() -> None:
    batch = synthetic_batch(2000, seed=1)
    means = [batch.images[batch.labels == c].mean(axis=0) for c in range(10)]
    assert min(np.abs(means[a] - means[b]).mean() for a in range(10) for b in range(a)) > 10


def test_cifar_batch_refuses_code_in_pickle() -> None:
    payload = _pickled(os.system)  # any global other than numpy array reconstruction
    with pytest.raises(DataFormatError, match="refusing to load"):
        parse_batch(payload, "evil")


def test_cifar_batch_rejects_out_of_range_labels() -> None:
    data = _pickled({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]})
    with pytest.raises(DataFormatError, match=r"labels outside 0\.\.9"):
        parse_batch(data, "bad")


def test_cifar_batch_rejects_wrong_shape_and_dtype() -> None:
    with pytest.raises(DataFormatError, match=r"shape \(2, 100\)"):
        parse_batch(_pickled({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}), "b")
    with pytest.raises(DataFormatError, match="uint8"):
        parse_batch(_pickled({"data": np.zeros((2, 3072), np.float32), "labels": [0, 1]}), "b")


def test_cifar_batch_rejects_non_pickle() -> None:
    with pytest.raises(DataFormatError, match="not a CIFAR-10 python batch"):
        parse_batch(io.BytesIO(b"hello").read(), "text")
