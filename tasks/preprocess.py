"""From a CIFAR-10 archive to a dataset on storage: validate, split, normalisation stats, write.

The Parquet files are written by Dask tasks in parallel, so ingest scales with the cluster.
A dataset too small to give every rank one batch is refused here, before training starts.
"""

from __future__ import annotations

import logging
import os
import posixpath
import tempfile

import numpy as np
from prefect import task

from cifar.archive import extract_archive
from cifar.dataset import (
    DataFile,
    Dataset,
    Manifest,
    is_intact,
    per_rank_batch_size,
    read_manifest,
    remove_manifest,
    write_file,
    write_manifest,
)
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
from tasks.caching import cached, policy
from tasks.download import Archive
from tasks.layout import StorageLayout
from tasks.retrying import TRANSIENT_RETRIES
from trainlib import DaskConfig

logger = logging.getLogger(__name__)


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


def intact_dataset(uri: str) -> Dataset | None:
    """The dataset at ``uri`` if its manifest is there and every file matches it, else None."""
    manifest = read_manifest(uri)
    if manifest is None or not is_intact(Dataset(uri, manifest)):
        return None
    return Dataset(uri, manifest)


def preprocess_archive(
    archive: Archive,
    layout: StorageLayout,
    *,
    dask_config: DaskConfig,
    num_workers: int,
    batch_size: int,
    rows_per_file: int = 2500,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> Dataset:
    """Turn a CIFAR-10 archive into a dataset on storage (kept: done once per archive).

    A dataset already there is reused only if every file matches its manifest's sha256;
    otherwise it is written again.

    Raises:
        DatasetTooSmallError: Too few images for ``num_workers`` ranks and ``batch_size``.
    """
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file={rows_per_file} must be at least 1 image per file.")
    uri = layout.dataset(dataset_name(archive.md5, val_fraction, seed, rows_per_file))
    if (existing := intact_dataset(uri)) is not None:
        logger.info("Dataset %s exists and is intact; skipping preprocessing", uri)
        manifest = existing.manifest
        check_trainable(manifest.rows("train"), manifest.rows("val"), num_workers, batch_size)
        return existing
    if read_manifest(uri) is not None:
        logger.warning("Dataset %s does not match its manifest; writing it again", uri)
        remove_manifest(uri)  # no manifest describes files being rewritten
    with tempfile.TemporaryDirectory(prefix="cifar-") as tmp:
        train, test, class_names = load_batches(extract_archive(archive.uri, tmp))
    synthetic = train.synthetic
    train, val = split_validation(train, val_fraction, seed)
    check_trainable(len(train.labels), len(val.labels), num_workers, batch_size)
    mean, std = channel_stats(train.images)
    splits = {"train": train, "val": val, "test": test}
    with dask_config.connect(num_workers=num_workers) as client:
        futures = {
            split: [
                client.submit(
                    write_file,
                    posixpath.join(uri, f"{split}-{index:05d}.parquet"),
                    batch.images[start : start + rows_per_file],
                    batch.labels[start : start + rows_per_file],
                    pure=False,
                )
                for index, start in enumerate(range(0, len(batch.labels), rows_per_file))
            ]
            for split, batch in splits.items()
        }
        files: dict[str, list[DataFile]] = {s: client.gather(f) for s, f in futures.items()}
    manifest = Manifest(
        source_md5=archive.md5,
        source_verified=archive.verified,
        class_names=class_names,
        mean=(mean[0], mean[1], mean[2]),
        std=(std[0], std[1], std[2]),
        val_fraction=val_fraction,
        seed=seed,
        splits=files,
        synthetic=synthetic,
    )
    write_manifest(uri, manifest)
    logger.info(
        "Wrote %s: %s", uri, ", ".join(f"{s} {manifest.rows(s)} images" for s in manifest.splits)
    )
    return Dataset(uri, manifest)


preprocess_task = task(name="preprocess", **TRANSIENT_RETRIES)(preprocess_archive)


def prepare_dataset(
    archive: Archive,
    layout: StorageLayout,
    *,
    dask_config: DaskConfig,
    num_workers: int,
    batch_size: int,
    rows_per_file: int = 2500,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> Dataset:
    """The preprocess step, cached by Prefect under the storage path (``tasks.caching``): a
    run on the same archive md5, seed, validation fraction, shard size, ranks and batch size
    (the size check) reuses the dataset if every file matches its manifest."""
    uri = layout.dataset(dataset_name(archive.md5, val_fraction, seed, rows_per_file))
    intact = intact_dataset(uri) is not None
    step = cached(preprocess_task, layout, policy("dask_config"), intact=intact)
    return step(
        archive,
        layout,
        dask_config=dask_config,
        num_workers=num_workers,
        batch_size=batch_size,
        rows_per_file=rows_per_file,
        val_fraction=val_fraction,
        seed=seed,
    )
