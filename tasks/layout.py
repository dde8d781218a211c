"""Where the pipeline keeps things under ``storage_path``: one layout, built once per flow run.

::

    {storage_path}/
        raw/{archive name}              downloaded archives
        synthetic/cifar-10-python.tar.gz   the archive ``--synthetic`` generates
        datasets/{name}/                preprocessed datasets (Parquet files + manifest.json)
        runs/{run name}/                training runs: checkpoints (trainlib's run directories)
        owners/{run name}.json          the flow run each run name belongs to (flows.run_ownership)
        predictions/{mlflow run id}.csv batch predictions of a flow run
        cache/                          Prefect's cached results of download and preprocess

A worker's operator may keep Prefect's cached results apart, where the Dask workers' credentials
do not reach (a record is unpickled by the flow that finds it): ``$CIFAR_CACHE_PATH`` (a folder
or URL; each storage path's records in a folder of their own under it) and
``$CIFAR_CACHE_STORAGE_OPTIONS`` (JSON: fsspec's options for it, e.g. ``{"profile": "cache"}``
for an S3 key of its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass
from typing import Any

import fsspec

from mlops.outages import ride_out

# The folders the pipeline writes and reads back under a storage path (above): what a run's
# other outputs may never write into (flows.predict_output)
KEPT_FOLDERS = frozenset({"raw", "synthetic", "datasets", "runs", "owners", "cache"})
STORAGE_PATH_VARIABLE = "CIFAR_STORAGE_PATH"  # where a deployment's work pool names the storage
DEFAULT_STORAGE_PATH = "./cifar-data"
CACHE_PATH_VARIABLE = "CIFAR_CACHE_PATH"
CACHE_OPTIONS_VARIABLE = "CIFAR_CACHE_STORAGE_OPTIONS"


@dataclass(frozen=True)
class StorageLayout:
    """Every location of the pipeline under one root: a local folder or an fsspec URL.

    Attributes:
        root: The root as a URL or absolute local path, ``~`` expanded, no trailing slash.
        cache_root: Where the worker's operator keeps Prefect's cached results (None: under
            the root).
        cache_options: fsspec's options for ``cache_root``, as (name, JSON value) pairs.
    """

    root: str
    cache_root: str | None = None
    cache_options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def at(cls, storage_path: str | None) -> StorageLayout:
        """The layout under ``storage_path`` (``~`` expanded, relative paths made absolute);
        None: $CIFAR_STORAGE_PATH, else ``./cifar-data``."""
        if storage_path is None:
            storage_path = os.environ.get(STORAGE_PATH_VARIABLE) or DEFAULT_STORAGE_PATH
        if not storage_path.strip():
            raise ValueError("storage_path is empty; give a folder or a URL such as s3://bucket.")
        cache_root, cache_options = _operator_cache()
        return cls(_absolute(storage_path), cache_root, cache_options)

    def join(self, *parts: str) -> str:
        """A location under the root."""
        return posixpath.join(self.root, *parts)

    def raw_archive(self, url: str) -> str:
        """Where the archive downloaded from ``url`` is kept."""
        return self.join("raw", posixpath.basename(url.rstrip("/")) or "archive.tar.gz")

    @property
    def synthetic_archive(self) -> str:
        """Where ``--synthetic`` writes its generated archive."""
        return self.join("synthetic", "cifar-10-python.tar.gz")

    def dataset(self, name: str) -> str:
        """The directory of the preprocessed dataset ``name``."""
        return self.join("datasets", name)

    @property
    def runs(self) -> str:
        """The parent of the training runs' directories (trainlib's ``storage_path``)."""
        return self.join("runs")

    @property
    def cache(self) -> str:
        """Where Prefect keeps the cached results of the data steps: under the root, or the
        operator's cache root in a folder named after the root."""
        if self.cache_root is None:
            return self.join("cache")
        return posixpath.join(self.cache_root, hashlib.sha256(self.root.encode()).hexdigest()[:16])

    @property
    def cache_storage_options(self) -> dict[str, Any]:
        """fsspec's options for the cache folder."""
        return {name: json.loads(value) for name, value in self.cache_options}

    def predictions(self, run_id: str) -> str:
        """Where the batch predictions of MLflow run ``run_id`` are written."""
        return self.join("predictions", f"{run_id}.csv")

    def check_writable(self, folder: str | None = None, **storage_options: Any) -> None:
        """Raise ``PermissionError`` naming the root (or ``folder``) if nothing can be written
        there (a storage out of reach is waited for, ``mlops.outages.ride_out``)."""
        probe = posixpath.join(folder or self.root, ".write-probe")

        def write() -> None:
            fs, path = fsspec.core.url_to_fs(probe, **storage_options)
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            fs.pipe_file(path, b"")
            fs.rm_file(path)

        try:
            ride_out(write, f"write under {folder or self.root}")  # S3 out of reach: waited
        except (OSError, ValueError) as exc:
            raise PermissionError(
                f"Cannot write under {folder or f'storage_path {self.root}'} "
                f"({type(exc).__name__}: {exc}); "
                "give a folder you can write to, or check the credentials of that bucket."
            ) from exc


def _absolute(path: str) -> str:
    """A URL without its trailing slash, or an absolute local path with ``~`` expanded."""
    if "://" in path:
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def _operator_cache() -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The worker's cache root and its options, from the environment (the module's docstring)."""
    root = os.environ.get(CACHE_PATH_VARIABLE, "").strip()
    raw = os.environ.get(CACHE_OPTIONS_VARIABLE, "").strip()
    try:
        options = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"${CACHE_OPTIONS_VARIABLE} is not JSON ({exc}); give an object such "
                         'as {"profile": "cache"}, or unset it.') from exc  # fmt: skip
    if not isinstance(options, dict):
        raise ValueError(f"${CACHE_OPTIONS_VARIABLE} must be a JSON object of fsspec options.")
    pairs = tuple(sorted((str(k), json.dumps(v)) for k, v in options.items()))
    return (_absolute(root) if root else None), pairs
