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
    DEMO,
    EASY,
    META,
    DataFormatError,
    Difficulty,
    class_patterns,
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


def _class_distance(difficulty: Difficulty) -> float:
    batch = synthetic_batch(4000, seed=1, difficulty=difficulty)
    means = [batch.images[batch.labels == c].mean(axis=0) for c in range(10)]
    return float(min(np.abs(means[a] - means[b]).mean() for a in range(10) for b in range(a)))


def _nearest_mean_accuracy(difficulty: Difficulty) -> float:
    """The accuracy of the rule "the class whose pattern is nearest" (knowing the patterns)."""
    batch = synthetic_batch(2000, seed=3, difficulty=difficulty)
    patterns = class_patterns(difficulty)
    distance = ((batch.images[:, None].astype(np.float32) - patterns[None]) ** 2).sum((2, 3, 4))
    return float((distance.argmin(1) == batch.labels).mean())


def test_cifar_synthetic_demo_classes_overlap_in_the_image_not_in_the_labels() -> None:
    assert _class_distance(DEMO) < _class_distance(EASY) / 2
    assert _nearest_mean_accuracy(EASY) == 1.0
    # knowing each class's pattern is not enough: about one image in eight looks like another
    assert 0.8 < _nearest_mean_accuracy(DEMO) < 0.92
    assert DEMO.label_noise == 0.0


def test_cifar_synthetic_patterns_are_symmetric_under_a_horizontal_flip() -> None:
    for difficulty in (EASY, DEMO):
        patterns = class_patterns(difficulty)
        assert np.allclose(patterns, patterns[..., ::-1])
        shifted = np.abs(patterns[..., 4:] - patterns[..., :-4]).mean()  # a 4-pixel crop
        assert shifted < np.abs(patterns - patterns.mean()).mean() / 2


def test_cifar_synthetic_difficulty_refuses_values_outside_its_range() -> None:
    for bad in ({"separation": 0.0}, {"separation": 1.5}, {"label_noise": 1.0}):
        with pytest.raises(ValueError, match="separation must be in"):
            Difficulty(**bad)
    with pytest.raises(ValueError, match="overlap must be in"):
        Difficulty(overlap=1.0)


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
