"""Prefect's task cache for the data steps (download, preprocess), kept under the storage path.

A step is cached by its inputs (URL and expected md5; archive checksum, split seed, validation
fraction and shard size) and its code. Its result (the archive's or dataset's location and
checksums) is persisted under ``{storage_path}/cache/``, so a later run on the same data, in
any process, finds it and Prefect shows the step as Cached without running it.

A cached result is used only if the files it names are intact: the flow checks them first
(the archive's md5, every dataset file's sha256) and makes Prefect recompute the step
(``refresh_cache``) when one is missing or corrupt. When the cache folder cannot be written,
the steps run uncached, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, TypeVar

from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE, CachePolicy
from prefect.filesystems import RemoteFileSystem, WritableFileSystem
from prefect.tasks import Task

from tasks.layout import StorageLayout

logger = logging.getLogger(__name__)

TaskT = TypeVar("TaskT", bound=Task[Any, Any])


def policy(*excluded: str) -> CachePolicy:
    """The task's inputs (except ``excluded``: what does not change the result) and code."""
    inputs: CachePolicy = INPUTS
    for name in excluded:
        inputs = inputs - name
    return inputs + TASK_SOURCE


def result_storage(layout: StorageLayout) -> WritableFileSystem | Path | None:
    """Where cached results are kept, or None (warned) if that folder cannot be written.

    A local folder is a path; a bucket is a ``RemoteFileSystem`` block saved on the Prefect
    server (Prefect keeps only saved blocks as result storage), named after the folder.
    """
    options = layout.cache_storage_options
    try:
        layout.check_writable(layout.cache, **options)
    except PermissionError as exc:
        logger.warning("%s Data steps run without Prefect's cache.", exc)
        return None
    if "://" not in layout.cache:
        return Path(layout.cache)
    block = RemoteFileSystem(basepath=layout.cache, settings=options)  # no secret: a profile
    digest = hashlib.sha256(layout.cache.encode()).hexdigest()[:12]
    block.save(f"cifar-cache-{digest}", overwrite=True)
    return block


def cached(task: TaskT, layout: StorageLayout, cache_policy: CachePolicy, *, intact: bool) -> TaskT:
    """``task`` cached under the layout's cache folder; recomputed (its cache entry replaced)
    unless ``intact`` says the files of a cached result are all there and unchanged."""
    storage = result_storage(layout)
    if storage is None:
        return task.with_options(cache_policy=NO_CACHE, persist_result=False)  # type: ignore[return-value]
    if not intact:
        logger.info("No intact result of %s under %s: computing it", task.name, layout.cache)
    return task.with_options(  # type: ignore[return-value]
        cache_policy=cache_policy,
        result_storage=storage,
        persist_result=True,
        refresh_cache=not intact,
    )
