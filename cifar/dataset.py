"""A preprocessed CIFAR dataset on storage: Parquet files per split, and their manifest.

::

    datasets/{name}/
        train-00000.parquet ...   image: 3072 bytes (a 3x32x32 uint8 image, channel-major),
        val-00000.parquet ...     label: int64; one file per ``rows_per_file`` images
        test-00000.parquet ...
        manifest.json             written last: every file with its rows and sha256, each
                                  split's content digest, the class names, and the training
                                  split's per-channel mean and std

A file is read only after its sha256 matches the manifest. Training reads the train and val
splits as Dask arrays (one chunk per file) through ``TorchTrainer(datasets=...)``.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cifar.errors import CorruptDataError
from cifar.format import IMAGE_SHAPE, Batch

if TYPE_CHECKING:
    import dask.array as da

    from trainlib.data import DataConfig

MANIFEST = "manifest.json"
_IMAGE_BYTES = int(np.prod(IMAGE_SHAPE))


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of a split."""

    file: str
    rows: int
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
    splits: dict[str, list[DataFile]]
    synthetic: bool = False  # made from an archive ``write_synthetic_archive`` wrote
    # split -> ``content_digest`` of its images and labels, whatever files hold them
    contents: dict[str, str] = field(default_factory=dict)

    def rows(self, split: str) -> int:
        """Number of images in a split."""
        return sum(f.rows for f in self.splits[split])

    def digest(self, *splits: str) -> str:
        """A fingerprint of the data of ``splits`` (all of them if none is named), from their
        decoded images and labels (``contents``): the same images and labels in the same order
        give the same digest however they are cut into files (``rows_per_file``) or encoded
        (a pyarrow upgrade), and another archive, seed or split another. It keys the test
        split's comparisons in the promotion ledger. 16 hex digits (MLflow keeps at most 36).

        Raises:
            KeyError: A split has no content digest (a manifest not made by preprocessing).
        """
        chosen = splits or tuple(sorted(self.splits))
        text = ";".join(f"{s}:{self.contents[s]}" for s in chosen)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """The manifest in ``text``.

        Raises:
            KeyError: A field is missing (a manifest of an older format: rebuild the dataset).
        """
        raw = json.loads(text)
        for key in ("synthetic", "contents"):  # fields older datasets were written without
            if key not in raw:
                raise KeyError(key)
        raw["splits"] = {k: [DataFile(**f) for f in v] for k, v in raw["splits"].items()}
        raw["class_names"] = tuple(raw["class_names"])
        raw["mean"], raw["std"] = tuple(raw["mean"]), tuple(raw["std"])
        return cls(**raw)


@dataclass(frozen=True)
class Dataset:
    """A dataset on storage: where it is and what it holds (small: passed between tasks)."""

    uri: str
    manifest: Manifest


def per_rank_batch_size(global_batch_size: int, world_size: int) -> int:
    """The batch each rank trains on: the global batch shared between the ranks (at least 1)."""
    return max(1, global_batch_size // world_size)


def read_manifest(uri: str) -> Manifest | None:
    """The manifest of the dataset at ``uri``, or None if it is not (completely) written or
    is of an older format."""
    try:
        with fsspec.open(posixpath.join(uri, MANIFEST), "r") as f:
            return Manifest.from_json(f.read())
    except (FileNotFoundError, KeyError):
        return None


def is_intact(dataset: Dataset) -> bool:
    """Whether every file of the dataset is there with the sha256 its manifest says (the
    manifest itself too): a dataset reused from an earlier run is checked, never trusted."""
    if read_manifest(dataset.uri) != dataset.manifest:
        return False
    for entries in dataset.manifest.splits.values():
        for entry in entries:
            try:
                with fsspec.open(posixpath.join(dataset.uri, entry.file), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return False
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                return False
    return True


def remove_manifest(uri: str) -> None:
    """Remove the manifest (if any): the dataset no longer counts as written."""
    fs, path = fsspec.core.url_to_fs(posixpath.join(uri, MANIFEST))
    if fs.exists(path):
        fs.rm_file(path)


def write_manifest(uri: str, manifest: Manifest) -> None:
    """Write the manifest: the last step of writing a dataset."""
    with fsspec.open(posixpath.join(uri, MANIFEST), "w") as f:
        f.write(manifest.to_json())


def content_digest(images: np.ndarray, labels: np.ndarray) -> str:
    """The sha256 of images (N, 3, 32, 32) uint8 and their labels as decoded: their bytes,
    in order, the labels as little-endian int64."""
    digest = hashlib.sha256(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    digest.update(np.asarray(labels, dtype="<i8").tobytes())
    return digest.hexdigest()


def write_file(uri: str, images: np.ndarray, labels: np.ndarray) -> DataFile:
    """Write one Parquet file of images (N, 3, 32, 32) uint8 and labels (runs as a Dask task)."""
    flat = np.ascontiguousarray(images, dtype=np.uint8).reshape(len(labels), _IMAGE_BYTES)
    image_column = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(_IMAGE_BYTES), len(labels), [None, pa.py_buffer(flat.tobytes())]
    )
    table = pa.table({"image": image_column, "label": pa.array(labels.astype(np.int64))})
    buffer = io.BytesIO()
    pq.write_table(
        table, buffer, compression="none"
    )  # image bytes hardly compress; reads stay cheap
    data = buffer.getvalue()
    with fsspec.open(uri, "wb") as f:
        f.write(data)
    return DataFile(posixpath.basename(uri), len(labels), hashlib.sha256(data).hexdigest())


def read_file(dataset_uri: str, entry: DataFile) -> Batch:
    """Read one Parquet file of a dataset, after checking its sha256.

    Raises:
        CorruptDataError: The file's bytes do not match the manifest.
    """
    with fsspec.open(posixpath.join(dataset_uri, entry.file), "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CorruptDataError(
            f"{entry.file} in {dataset_uri} is corrupt (its sha256 does not match the "
            "manifest); delete the dataset directory and run the flow again to rebuild it."
        )
    table = pq.read_table(pa.BufferReader(data))
    column = table.column("image").combine_chunks()
    images = np.frombuffer(column.buffers()[1], np.uint8, count=len(column) * _IMAGE_BYTES)
    labels = table.column("label").to_numpy()
    return Batch(images.reshape(len(column), *IMAGE_SHAPE), labels.astype(np.int64))


def read_split(dataset: Dataset, split: str) -> Batch:
    """All images and labels of a split, in file order."""
    batches = [read_file(dataset.uri, f) for f in dataset.manifest.splits[split]]
    return Batch(
        np.concatenate([b.images for b in batches]), np.concatenate([b.labels for b in batches])
    )


def split_arrays(dataset: Dataset, split: str) -> dict[str, da.Array]:
    """A split as lazy Dask arrays ``image`` (N, 3, 32, 32) uint8 and ``label`` (N,), one chunk
    per file: what ``TorchTrainer(datasets=...)`` streams into the ranks."""
    import dask.array as da
    from dask.delayed import delayed

    files = dataset.manifest.splits[split]
    batches = [delayed(read_file, pure=True)(dataset.uri, f) for f in files]
    images = [
        da.from_delayed(b.images, shape=(f.rows, *IMAGE_SHAPE), dtype=np.uint8)
        for b, f in zip(batches, files, strict=True)
    ]
    labels = [
        da.from_delayed(b.labels, shape=(f.rows,), dtype=np.int64)
        for b, f in zip(batches, files, strict=True)
    ]
    return {"image": da.concatenate(images), "label": da.concatenate(labels)}


def ingest_config(use_gpu: bool) -> DataConfig:
    """How the splits reach the ranks: CIFAR's fit a rank's memory (150 MB for the whole
    training split), so each rank keeps its share after the first epoch (on its GPU with
    ``use_gpu``) and later epochs read no data from Dask. A larger dataset (over 2 GiB a rank)
    streams every epoch; the ranks' logs say which happened. The files' order is shuffled at
    every epoch that streams (``shuffle_seed``), so a streaming rank sees other files."""
    from trainlib.data import DataConfig

    return DataConfig(cache_shards="device" if use_gpu else "host", shuffle_seed=0)
