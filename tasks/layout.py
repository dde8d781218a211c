"""Where the pipeline keeps things under ``storage_path``: one layout, built once per flow run.

::

    {storage_path}/
        raw/{archive name}              downloaded archives
        synthetic/cifar-10-python.tar.gz   the archive ``--synthetic`` generates
        datasets/{name}/                preprocessed datasets (Parquet files + manifest.json)
        runs/{run name}/                training runs: checkpoints (trainlib's run directories)
        predictions/{mlflow run id}.csv batch predictions of a flow run
        cache/                          Prefect's cached results of download and preprocess
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

import fsspec

from mlops.outages import ride_out

STORAGE_PATH_VARIABLE = "CIFAR_STORAGE_PATH"  # where a deployment's work pool names the storage
DEFAULT_STORAGE_PATH = "./cifar-data"


@dataclass(frozen=True)
class StorageLayout:
    """Every location of the pipeline under one root: a local folder or an fsspec URL.

    Attributes:
        root: The root as a URL or absolute local path, ``~`` expanded, no trailing slash.
    """

    root: str

    @classmethod
    def at(cls, storage_path: str | None) -> StorageLayout:
        """The layout under ``storage_path`` (``~`` expanded, relative paths made absolute);
        None: $CIFAR_STORAGE_PATH, else ``./cifar-data``."""
        if storage_path is None:
            storage_path = os.environ.get(STORAGE_PATH_VARIABLE) or DEFAULT_STORAGE_PATH
        if not storage_path.strip():
            raise ValueError("storage_path is empty; give a folder or a URL such as s3://bucket.")
        if "://" in storage_path:
            return cls(storage_path.rstrip("/"))
        return cls(os.path.abspath(os.path.expanduser(storage_path)))

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
        """Where Prefect keeps the cached results of the data steps."""
        return self.join("cache")

    def predictions(self, run_id: str) -> str:
        """Where the batch predictions of MLflow run ``run_id`` are written."""
        return self.join("predictions", f"{run_id}.csv")

    def check_writable(self, folder: str | None = None) -> None:
        """Raise ``PermissionError`` naming the root (or ``folder`` under it) if nothing can be
        written there (a storage out of reach is waited for, ``mlops.outages.ride_out``)."""
        probe = posixpath.join(folder or self.root, ".write-probe")

        def write() -> None:
            fs, path = fsspec.core.url_to_fs(probe)
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
