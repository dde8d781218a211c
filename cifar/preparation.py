"""From an extracted CIFAR-10 archive to a dataset's parts, as plain functions: the batches
read and validated, the seeded validation split, the normalisation statistics, the check that
every rank gets a batch, and the dataset's name. ``tasks/preprocess.py`` writes them out on
Dask."""

from __future__ import annotations

import os

import numpy as np

from cifar.dataset import per_rank_batch_size
from cifar.errors import NotCifarArchiveError, PipelineError
from cifar.format import (
    META,
    TEST_BATCH,
    TRAIN_BATCHES,
    Batch,
    DataFormatError,
    parse_batch,
    parse_meta,
)


class DatasetTooSmallError(PipelineError, ValueError):
    """The dataset cannot give every rank a batch."""


def load_batches(batches_dir: str) -> tuple[Batch, Batch, tuple[str, ...]]:
    """All training images, the test images and the class names, validated."""

    def read(name: str) -> bytes:
        with open(os.path.join(batches_dir, name), "rb") as f:
            return f.read()

    try:
        train = [parse_batch(read(name), name) for name in TRAIN_BATCHES]
        test = parse_batch(read(TEST_BATCH), TEST_BATCH)
        class_names = parse_meta(read(META))
    except DataFormatError as exc:
        raise NotCifarArchiveError(
            f"The archive is not in the CIFAR-10 python format: {exc}. Point data_url at "
            "cifar-10-python.tar.gz (the python version of CIFAR-10)."
        ) from exc
    images = np.concatenate([b.images for b in train])
    labels = np.concatenate([b.labels for b in train])
    synthetic = all(b.synthetic for b in (*train, test))
    return Batch(images, labels, synthetic), test, class_names


def split_validation(train: Batch, val_fraction: float, seed: int) -> tuple[Batch, Batch]:
    """A seeded random split of the training images into train and validation."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1")
    order = np.random.default_rng(seed).permutation(len(train.labels))
    num_val = round(len(order) * val_fraction)
    val, rest = order[:num_val], order[num_val:]
    return Batch(train.images[rest], train.labels[rest]), Batch(
        train.images[val], train.labels[val]
    )


def channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images, on the 0..1 scale."""
    pixels = images.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64) / 255.0
    return tuple(pixels.mean(axis=1).tolist()), tuple(pixels.std(axis=1).tolist())


def check_trainable(train_rows: int, val_rows: int, num_workers: int, batch_size: int) -> None:
    """Raise unless every rank gets at least one training batch and one validation image.

    Raises:
        DatasetTooSmallError: Naming the counts and what to change.
    """
    per_rank_batch = per_rank_batch_size(batch_size, num_workers)
    if train_rows // num_workers < per_rank_batch or val_rows < num_workers:
        raise DatasetTooSmallError(
            f"The dataset has {train_rows} training and {val_rows} validation images: too few "
            f"for {num_workers} ranks with a global batch of {batch_size} (each rank needs "
            f"{per_rank_batch} training images and 1 validation image per epoch). Use a smaller "
            "batch_size, fewer num_workers, or a bigger archive."
        )


def dataset_name(source_md5: str, val_fraction: float, seed: int, rows_per_file: int) -> str:
    """The directory name of the dataset made from an archive with these settings."""
    return f"cifar10-{source_md5[:12]}-val{val_fraction:g}-seed{seed}-rows{rows_per_file}"
