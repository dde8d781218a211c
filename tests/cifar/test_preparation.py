"""Preparing a dataset's parts: a seeded split, train-only statistics, the size check."""

from __future__ import annotations

import numpy as np
import pytest

from cifar.format import Batch
from cifar.preparation import (
    DatasetTooSmallError,
    channel_stats,
    check_trainable,
    split_validation,
)


def test_preparation_split_is_seeded_disjoint_and_complete() -> None:
    batch = Batch(np.zeros((100, 3, 32, 32), np.uint8), np.arange(100))
    train, val = split_validation(batch, 0.2, seed=7)
    again, _ = split_validation(batch, 0.2, seed=7)
    assert len(val.labels) == 20 and len(train.labels) == 80
    assert set(train.labels) | set(val.labels) == set(range(100))
    assert np.array_equal(train.labels, again.labels)
    other, _ = split_validation(batch, 0.2, seed=8)
    assert not np.array_equal(train.labels, other.labels)


def test_preparation_channel_stats_per_channel() -> None:
    images = np.zeros((4, 3, 2, 2), np.uint8)
    images[:, 1] = 255
    images[:2, 2] = 255
    mean, std = channel_stats(images)
    assert mean == pytest.approx((0.0, 1.0, 0.5))
    assert std == pytest.approx((0.0, 0.0, 0.5))


def test_preparation_too_small_for_the_ranks_says_what_to_change() -> None:
    check_trainable(train_rows=512, val_rows=2, num_workers=2, batch_size=512)
    with pytest.raises(DatasetTooSmallError, match="each rank needs 256 training images"):
        check_trainable(train_rows=510, val_rows=2, num_workers=2, batch_size=512)
    with pytest.raises(DatasetTooSmallError, match="Use a smaller batch_size, fewer num_workers"):
        check_trainable(train_rows=1000, val_rows=1, num_workers=2, batch_size=8)
