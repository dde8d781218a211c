"""``--synthetic``: a generated archive in the CIFAR-10 format, for a run with no download."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

SYNTHETIC_IMAGES_PER_BATCH = 1000


def make_synthetic_archive(storage_path: str | None) -> tuple[str, str]:
    """Write a synthetic CIFAR-10 archive (``DEMO`` difficulty) under ``storage_path``; return
    its URL and md5."""
    import fsspec

    from cifar.format import DEMO, write_synthetic_archive
    from tasks.layout import StorageLayout

    target = StorageLayout.at(storage_path).synthetic_archive
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "cifar-10-python.tar.gz")
        md5 = write_synthetic_archive(
            local, images_per_batch=SYNTHETIC_IMAGES_PER_BATCH, difficulty=DEMO
        )
        fs, path = fsspec.core.url_to_fs(target)
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        fs.put_file(local, path)
    return fs.unstrip_protocol(path), md5


def use_synthetic_archive(params: dict[str, Any], command: str) -> None:
    """Point the run's ``data_url`` and ``data_md5`` at a new synthetic archive, and say so."""
    params["data_url"], params["data_md5"] = make_synthetic_archive(params["storage_path"])
    logging.getLogger(command).warning(
        "SYNTHETIC DATA: training on a generated archive in the CIFAR-10 format (%s), not on "
        "CIFAR-10; accuracies say nothing about real images.",
        params["data_url"],
    )
