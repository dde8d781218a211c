"""From CIFAR batches to training shards: validate, split, normalise stats, write shards.

A dataset directory on storage holds uint8 shards (``{split}-{index:05d}.npz`` with
``images`` (N, 3, 32, 32) and ``labels`` (N,)) and a ``manifest.json`` describing them. The
shards are written by Dask tasks in parallel, so ingest scales with the cluster, apart from
training.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import fsspec
import numpy as np
from distributed import Client
from prefect import task

from tasks.cifar import META, TEST_BATCH, TRAIN_BATCHES, Batch, parse_batch, parse_meta
from trainlib import DaskConfig

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Shard:
    """One shard file of a split."""

    file: str
    count: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a dataset directory holds."""

    source_md5: str
    source_verified: bool
    class_names: tuple[str, ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    val_fraction: float
    seed: int
    splits: dict[str, list[Shard]]

    def count(self, split: str) -> int:
        """Number of images in a split."""
        return sum(s.count for s in self.splits[split])

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        raw["splits"] = {k: [Shard(**s) for s in v] for k, v in raw["splits"].items()}
        raw["class_names"] = tuple(raw["class_names"])
        raw["mean"], raw["std"] = tuple(raw["mean"]), tuple(raw["std"])
        return cls(**raw)


def read_manifest(dataset_uri: str) -> Manifest:
    """The manifest of a dataset directory."""
    with fsspec.open(posixpath.join(dataset_uri, MANIFEST), "r") as f:
        return Manifest.from_json(f.read())


def load_batches(batches_dir: str) -> tuple[Batch, Batch, tuple[str, ...]]:
    """All training images, the test images and the class names, validated."""

    def read(name: str) -> bytes:
        with open(os.path.join(batches_dir, name), "rb") as f:
            return f.read()

    train = [parse_batch(read(name), name) for name in TRAIN_BATCHES]
    test = parse_batch(read(TEST_BATCH), TEST_BATCH)
    images = np.concatenate([b.images for b in train])
    labels = np.concatenate([b.labels for b in train])
    return Batch(images, labels), test, parse_meta(read(META))


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


def write_shard(uri: str, images: np.ndarray, labels: np.ndarray) -> Shard:
    """Write one shard (runs as a Dask task)."""
    buffer = io.BytesIO()
    np.savez(buffer, images=images, labels=labels)
    data = buffer.getvalue()
    with fsspec.open(uri, "wb") as f:
        f.write(data)
    return Shard(posixpath.basename(uri), len(labels), hashlib.sha256(data).hexdigest())


def read_shard(dataset_uri: str, shard: Shard) -> Batch:
    """Read one shard and check its sha256."""
    with fsspec.open(posixpath.join(dataset_uri, shard.file), "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        raise ValueError(
            f"shard {shard.file} in {dataset_uri} is corrupt (sha256 mismatch); "
            "delete the dataset directory and preprocess again"
        )
    with np.load(io.BytesIO(data)) as arrays:
        return Batch(arrays["images"], arrays["labels"])


def write_dataset(
    client: Client,
    dataset_uri: str,
    splits: dict[str, Batch],
    shard_size: int,
    manifest_fields: dict[str, Any],
) -> Manifest:
    """Write every split as shards through Dask tasks, then the manifest (last)."""
    jobs = []
    for split, batch in splits.items():
        for index, start in enumerate(range(0, len(batch.labels), shard_size)):
            uri = posixpath.join(dataset_uri, f"{split}-{index:05d}.npz")
            part = slice(start, start + shard_size)
            jobs.append(
                (
                    split,
                    client.submit(
                        write_shard, uri, batch.images[part], batch.labels[part], pure=False
                    ),
                )
            )
    shards: dict[str, list[Shard]] = {split: [] for split in splits}
    for split, future in jobs:
        shards[split].append(future.result())
    manifest = Manifest(splits=shards, **manifest_fields)
    with fsspec.open(posixpath.join(dataset_uri, MANIFEST), "w") as f:
        f.write(manifest.to_json())
    logger.info(
        "Wrote %s: %s", dataset_uri, ", ".join(f"{s} {manifest.count(s)} images" for s in shards)
    )
    return manifest


def preprocess_archive(
    archive_uri: str,
    source_md5: str,
    source_verified: bool,
    storage_path: str,
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    shard_size: int = 2500,
    dask: DaskConfig | None = None,
    num_workers: int = 2,
) -> str:
    """Turn a CIFAR-10 archive into a dataset directory on storage; return its URI.

    Skips the work when a dataset for the same archive and settings exists already.
    """
    from tasks.cluster import dask_client
    from tasks.data import extract_archive

    name = f"cifar10-{source_md5[:12]}-val{val_fraction:g}-seed{seed}-shard{shard_size}"
    dataset_uri = posixpath.join(storage_path.rstrip("/"), "datasets", name)
    fs, path = fsspec.core.url_to_fs(dataset_uri)
    if fs.exists(posixpath.join(path, MANIFEST)):
        logger.info("Dataset %s exists; skipping preprocessing", dataset_uri)
        return dataset_uri
    with tempfile.TemporaryDirectory(prefix="cifar-") as tmp:
        train, test, class_names = load_batches(extract_archive(archive_uri, tmp))
    train, val = split_validation(train, val_fraction, seed)
    mean, std = channel_stats(train.images)
    fields = {
        "source_md5": source_md5,
        "source_verified": source_verified,
        "class_names": class_names,
        "mean": mean,
        "std": std,
        "val_fraction": val_fraction,
        "seed": seed,
    }
    with dask_client(dask or DaskConfig(), num_workers) as client:
        write_dataset(
            client, dataset_uri, {"train": train, "val": val, "test": test}, shard_size, fields
        )
    return dataset_uri


preprocess_task = task(name="preprocess")(preprocess_archive)
