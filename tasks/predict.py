"""Batch prediction: score images with a registered model, write a table of predictions."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

import fsspec
import numpy as np
import pandas as pd
from PIL import Image
from prefect import task

from cifar.format import CLASS_NAMES, DataFormatError, parse_batch
from mlops.evaluation import score
from mlops.model_loading import load_model
from tasks.retrying import TRANSIENT_RETRIES

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class Inputs:
    """Images to score (N, 3, 32, 32) uint8 with their names, and the ones that failed."""

    names: list[str]
    images: np.ndarray
    errors: list[tuple[str, str]]


@dataclass(frozen=True)
class PredictionSummary:
    """Where the predictions went and what scored them."""

    output_uri: str
    errors_uri: str | None
    num_scored: int
    num_errors: int
    model_name: str
    model_version: str


def _read_image(fs: fsspec.AbstractFileSystem, path: str) -> np.ndarray:
    with fs.open(path, "rb") as f, Image.open(f) as image:
        rgb = image.convert("RGB")
        if rgb.size != (32, 32):
            rgb = rgb.resize((32, 32), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def read_inputs(input_uri: str) -> Inputs:
    """Images from a folder (PNG/JPEG), one image file, or a CIFAR-format batch file.

    An image that cannot be read is listed in ``errors``; the rest are still returned.
    """
    web = urlsplit(input_uri).scheme.lower() in ("http", "https")
    # Over HTTP: no redirect followed (the flow checked them, flows.redirects), and only the
    # links of an index page that lie under it (a link may name any host).
    fs, path = fsspec.core.url_to_fs(input_uri, **({"allow_redirects": False} if web else {}))
    if fs.isdir(path):
        found = sorted(p for p in fs.find(path) if p.lower().endswith(IMAGE_SUFFIXES))
        files = [p for p in found if not web or p.startswith(path.rstrip("/") + "/")]
    elif path.lower().endswith(IMAGE_SUFFIXES):
        files = [path]
    else:
        try:
            batch = parse_batch(fs.cat_file(path), posixpath.basename(path))
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"No images at {input_uri}") from exc
        except DataFormatError as exc:
            raise ValueError(
                f"{input_uri} is neither an image, a folder of images nor a CIFAR batch: {exc}"
            ) from exc
        names = [f"{posixpath.basename(path)}[{i}]" for i in range(len(batch.labels))]
        return Inputs(names, batch.images, [])
    if not files:
        raise FileNotFoundError(f"No PNG or JPEG images under {input_uri}")
    names, images, errors = [], [], []
    for file in files:
        try:
            images.append(_read_image(fs, file))
            names.append(fs.unstrip_protocol(file))
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            reason = f"{posixpath.basename(file)} is not a readable PNG or JPEG image ({cause})"
            errors.append((fs.unstrip_protocol(file), reason))
    stacked = np.stack(images) if images else np.zeros((0, 3, 32, 32), dtype=np.uint8)
    return Inputs(names, stacked, errors)


def write_predictions(
    inputs: Inputs, probabilities: np.ndarray, output_uri: str, model_name: str, model_version: str
) -> PredictionSummary:
    """Write predictions as CSV, or Parquet when ``output_uri`` ends in ``.parquet``."""
    table = pd.DataFrame(
        {
            "file": inputs.names,
            "predicted_label": probabilities.argmax(1),
            "predicted_class": [CLASS_NAMES[i] for i in probabilities.argmax(1)],
        }
    )
    for index, name in enumerate(CLASS_NAMES):
        table[f"prob_{name}"] = probabilities[:, index]
    table["model_name"], table["model_version"] = model_name, model_version
    fs, path = fsspec.core.url_to_fs(output_uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as f:
        if output_uri.endswith(".parquet"):
            table.to_parquet(f, index=False)
        else:
            table.to_csv(f, index=False)
    errors_uri = None
    if inputs.errors:
        errors_uri = errors_beside(output_uri)
        with fsspec.open(errors_uri, "w") as f:
            pd.DataFrame(inputs.errors, columns=["file", "error"]).to_csv(f, index=False)
    return PredictionSummary(
        output_uri, errors_uri, len(table), len(inputs.errors), model_name, model_version
    )


def errors_beside(output_uri: str) -> str:
    """Where the images that could not be read are listed, beside the predictions."""
    return f"{posixpath.splitext(output_uri)[0]}.errors.csv"  # a dot in a folder is no extension


def predict(
    model_name: str, alias: str, input_uri: str, output_uri: str, tracking_uri: str
) -> PredictionSummary:
    """Score the images at ``input_uri`` with the registered model at ``alias``.

    Raises:
        ModelNotFoundError: No version of ``model_name`` has the alias (nothing is written).
    """
    model, version = load_model(model_name, alias, tracking_uri)
    inputs = read_inputs(input_uri)
    return write_predictions(inputs, score(model, inputs.images), output_uri, model_name, version)


predict_task = task(name="predict", **TRANSIENT_RETRIES)(predict)
