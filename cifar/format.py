"""The CIFAR-10 python format: reading its batches safely, and writing a synthetic archive.

The archive ``cifar-10-python.tar.gz`` holds ``cifar-10-batches-py/`` with ``data_batch_1`` to
``data_batch_5``, ``test_batch`` and ``batches.meta``. Each batch is a pickled dict with
``data`` (uint8, N x 3072, channel-major 32x32 images) and ``labels`` (N ints in 0..9).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
from dataclasses import dataclass
from typing import Any

import numpy as np

OFFICIAL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
OFFICIAL_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
               "dog", "frog", "horse", "ship", "truck")  # fmt: skip
IMAGE_SHAPE = (3, 32, 32)
# The ``batch_label`` of every batch ``write_synthetic_archive`` writes starts with this: a
# dataset made from such an archive knows its images are synthetic.
SYNTHETIC_LABEL = "synthetic"

# What a CIFAR batch pickle may reference: numpy array reconstruction and bytes. Anything else
# (os.system, ...) is refused, so a malicious archive cannot run code when parsed.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class DataFormatError(ValueError):
    """A file is not in the CIFAR-10 python format."""


@dataclass(frozen=True)
class Batch:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 of one batch; ``synthetic`` when
    ``write_synthetic_archive`` made it."""

    images: np.ndarray
    labels: np.ndarray
    synthetic: bool = False


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise DataFormatError(f"refusing to load {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def _unpickle(data: bytes, name: str) -> dict[str, Any]:
    try:
        value = _RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except DataFormatError as exc:
        raise DataFormatError(f"{name}: {exc}") from exc
    except Exception as exc:
        raise DataFormatError(f"{name} is not a CIFAR-10 python batch ({exc})") from exc
    if not isinstance(value, dict):
        raise DataFormatError(f"{name} holds a {type(value).__name__}, expected a dict")
    return value


def parse_batch(data: bytes, name: str) -> Batch:
    """Parse and validate one pickled batch (shapes, dtype, label range and count)."""
    batch = _unpickle(data, name)
    if "data" not in batch or "labels" not in batch:
        raise DataFormatError(f"{name} lacks 'data' or 'labels' (has {sorted(batch)})")
    images, labels = batch["data"], np.asarray(batch["labels"])
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        raise DataFormatError(f"{name}: data must be a uint8 array")
    if images.ndim != 2 or images.shape[1] != 3 * 32 * 32:
        raise DataFormatError(f"{name}: data has shape {images.shape}, expected (N, 3072)")
    if labels.shape != (images.shape[0],):
        raise DataFormatError(f"{name}: {labels.shape[0]} labels for {images.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASS_NAMES)):
        raise DataFormatError(f"{name}: labels outside 0..9")
    synthetic = str(batch.get("batch_label", "")).startswith(SYNTHETIC_LABEL)
    return Batch(images.reshape(-1, *IMAGE_SHAPE), labels.astype(np.int64), synthetic)


def parse_meta(data: bytes) -> tuple[str, ...]:
    """The class names from ``batches.meta``."""
    meta = _unpickle(data, META)
    names = tuple(meta.get("label_names", ()))
    if len(names) != len(CLASS_NAMES):
        raise DataFormatError(f"{META}: expected 10 label_names, got {len(names)}")
    return names


@dataclass(frozen=True)
class Difficulty:
    """How hard a synthetic archive is to learn.

    Each class is a smooth colour pattern, the same mirrored left to right (a horizontal flip,
    the pipeline's augmentation, is a symmetry of every image; its other one, a crop shifted
    by up to 4 pixels, moves patterns that change over 16 pixels or more), plus pixel noise.
    ``separation`` mixes each class's own pattern with one pattern all classes share: 1 gives
    ten unrelated patterns (a small CNN reaches test accuracy 1.0 in a few epochs), lower values
    bring the classes closer. ``overlap`` makes images ambiguous to the eye: each image mixes
    its class's pattern with another class's, the other's weight drawn uniformly in
    [0, overlap]; past 0.5 the image looks more like the other class than its own, so the best
    possible accuracy is about ``1 - max(0, overlap - 0.5) / overlap``, and which borderline
    images a model gets right depends on its training. ``label_noise`` is the share of images,
    train and test alike, whose label is drawn at random.
    """

    separation: float = 1.0
    overlap: float = 0.0
    label_noise: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 < self.separation <= 1.0 and 0.0 <= self.label_noise < 1.0):
            raise ValueError(f"{self}: separation must be in (0, 1] and label_noise in [0, 1)")
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"{self}: overlap must be in [0, 1)")


EASY = Difficulty()
# `train-cifar --synthetic`: classes that overlap in the image (about one image in eight looks
# more like another class: the best possible accuracy is about 0.88), no label noise; 5 epochs
# of small_cnn end between 0.7 and 0.95, and two seeds differ on dozens of test images.
DEMO = Difficulty(separation=0.5, overlap=0.57)


def class_patterns(difficulty: Difficulty) -> np.ndarray:
    """(10, 3, 32, 32) smooth class patterns, mirror-symmetric left to right."""
    pattern_rng = np.random.default_rng(12345)
    own = pattern_rng.uniform(0, 255, size=(len(CLASS_NAMES), 3, 4, 2))
    shared = pattern_rng.uniform(0, 255, size=(1, 3, 4, 2))
    mix = difficulty.separation
    half = own if mix == 1.0 else (1 - mix) * shared + mix * own
    coarse = np.concatenate([half, half[..., ::-1]], axis=3)  # columns 0 1 | 1 0
    # linear interpolation between the 4x4 values (at the centres of 8-pixel cells)
    centres = np.arange(4) * 8 + 3.5
    weights = np.array([np.interp(np.arange(32), centres, np.eye(4)[i]) for i in range(4)])
    return np.einsum("ckyx,yi,xj->ckij", coarse, weights, weights).astype(np.float32)


def synthetic_batch(num_images: int, seed: int, difficulty: Difficulty = EASY) -> Batch:
    """Images whose class is a smooth colour pattern, mixed with another's when the difficulty
    overlaps them, plus noise (see ``Difficulty``)."""
    patterns = class_patterns(difficulty)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASS_NAMES), size=num_images)
    noise = rng.standard_normal(size=(num_images, *IMAGE_SHAPE), dtype=np.float32) * 64
    other = (labels + rng.integers(1, len(CLASS_NAMES), size=num_images)) % len(CLASS_NAMES)
    weight = (rng.random(num_images) * difficulty.overlap).astype(np.float32)[:, None, None, None]
    mixed = (1 - weight) * patterns[labels] + weight * patterns[other]
    images = np.clip(mixed + noise, 0, 255).astype(np.uint8)
    if difficulty.label_noise > 0:
        relabel = rng.random(num_images) < difficulty.label_noise
        labels = np.where(relabel, rng.integers(0, len(CLASS_NAMES), size=num_images), labels)
    return Batch(images, labels.astype(np.int64))


def write_synthetic_archive(
    path: str, images_per_batch: int = 1000, seed: int = 0, difficulty: Difficulty = EASY
) -> str:
    """Write a ``cifar-10-python.tar.gz`` with synthetic images; return its md5."""
    members: dict[str, bytes] = {
        META: pickle.dumps(
            {
                "label_names": list(CLASS_NAMES),
                "num_cases_per_batch": images_per_batch,
                "num_vis": 3072,
            },
            protocol=2,
        )
    }
    for index, name in enumerate((*TRAIN_BATCHES, TEST_BATCH)):
        batch = synthetic_batch(images_per_batch, seed * 100 + index, difficulty)
        members[name] = pickle.dumps(
            {
                "batch_label": f"{SYNTHETIC_LABEL} {name}",
                "labels": batch.labels.tolist(),
                "data": batch.images.reshape(len(batch.labels), -1),
                "filenames": [f"synthetic_{name}_{i}.png" for i in range(len(batch.labels))],
            },
            protocol=2,
        )
    # Noise does not compress: gzip stores it as it is (level 0: 0.1 s instead of 5 s at 9).
    # Byte for byte the same archive for the same arguments: no time or file name in the gzip
    # header (tarfile's "w:gz" writes both), so a second run finds its data unchanged.
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=0, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w") as archive,
    ):
        for name, data in members.items():
            info = tarfile.TarInfo(f"{ARCHIVE_DIR}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with open(path, "rb") as f:
        return hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
