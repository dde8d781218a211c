"""From a CIFAR-10 archive to a dataset on storage: validate, split, normalisation stats, write.

The Parquet files are written by Dask tasks in parallel, so ingest scales with the cluster.
A dataset too small to give every rank one batch is refused here, before training starts.
"""

from __future__ import annotations

import logging
import posixpath
import tempfile

from prefect import task

from cifar.archive import extract_archive
from cifar.dataset import (
    DataFile,
    Dataset,
    Manifest,
    content_digest,
    is_intact,
    read_manifest,
    remove_manifest,
    write_file,
    write_manifest,
)
from cifar.preparation import (
    channel_stats,
    check_trainable,
    dataset_name,
    load_batches,
    split_validation,
)
from tasks.caching import cached, policy
from tasks.download import Archive
from tasks.layout import StorageLayout
from tasks.retrying import TRANSIENT_RETRIES
from trainlib import DaskConfig

logger = logging.getLogger(__name__)


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
        contents={s: content_digest(b.images, b.labels) for s, b in splits.items()},
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
