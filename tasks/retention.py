"""What the runs leave in storage, bounded: a published run keeps its registered checkpoint
only; a run that ended without publishing keeps its committed checkpoints (a run of the same
name resumes from them) for ``retention_days``, and never an uncommitted one.

Run directories are those of the flows' own run names (``train-cifar-<flow run id>``); a run
named by its user (``run_name=``) is pruned when it publishes, and otherwise left to its user.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

import fsspec
from prefect import task
from prefect.cache_policies import NO_CACHE

import trainlib
from tasks.flow_runs import ended
from tasks.retrying import TRANSIENT_RETRIES
from tasks.train import RUN_PREFIX

logger = logging.getLogger(__name__)

RETENTION_VARIABLE = "CIFAR_RETENTION_DAYS"  # the operator's, as Prefect's vacuum's
DEFAULT_RETENTION_DAYS = 90.0


def retention_days() -> float:
    """How long what ended runs left is kept: ``$CIFAR_RETENTION_DAYS``, else 90."""
    configured = os.environ.get(RETENTION_VARIABLE, str(DEFAULT_RETENTION_DAYS))
    try:
        days = float(configured)
    except ValueError:
        days = -1.0
    if days <= 0:
        raise ValueError(
            f"{RETENTION_VARIABLE}={configured!r} must be a positive number of days; fix the "
            "worker's environment"
        )
    return days


def _subdirectories(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    fs.invalidate_cache(path)
    return [e["name"].rstrip("/") for e in fs.ls(path, detail=True) if e["type"] == "directory"]


def prune_published(run_uri: str, registered_uri: str) -> list[str]:
    """Delete every directory of a published run but the registered checkpoint's; return them."""
    fs, run_dir = fsspec.core.url_to_fs(run_uri)
    _, keep = fsspec.core.url_to_fs(registered_uri)
    removed = [d for d in _subdirectories(fs, run_dir) if d != keep.rstrip("/")]
    for directory in removed:
        fs.rm(directory, recursive=True)
    if removed:
        logger.info("Pruned %d checkpoints of %s (kept %s)", len(removed), run_uri, registered_uri)
    return removed


@dataclass(frozen=True)
class Sweep:
    """What a sweep of the runs' storage removed."""

    uncommitted: tuple[str, ...]  # directories no checkpoint commit made
    expired: tuple[str, ...]  # run directories older than the retention


def sweep_runs(
    runs_uri: str,
    has_ended: Callable[[str], bool],
    retention_s: float,
    now: float | None = None,
) -> Sweep:
    """In the run directories of ended flow runs (``has_ended(flow_run_id)``): delete what no
    checkpoint commit made, and the whole directory once its newest file is older than
    ``retention_s``."""
    fs, root = fsspec.core.url_to_fs(runs_uri)
    now = time.time() if now is None else now
    if not fs.exists(root):
        return Sweep((), ())
    uncommitted: list[str] = []
    expired: list[str] = []
    for run_dir in _subdirectories(fs, root):
        flow_run_id = run_dir.rsplit("/", 1)[-1].removeprefix(RUN_PREFIX)
        if not run_dir.rsplit("/", 1)[-1].startswith(RUN_PREFIX) or not _is_uuid(flow_run_id):
            continue
        if not has_ended(flow_run_id):
            continue
        if now - _newest(fs, run_dir) > retention_s:
            fs.rm(run_dir, recursive=True)
            expired.append(run_dir)
            continue
        committed = {
            c.path.rstrip("/") for c, _ in trainlib.Result.from_path(run_dir, fs).best_checkpoints
        }
        for directory in _subdirectories(fs, run_dir):
            if directory not in committed:
                fs.rm(directory, recursive=True)
                uncommitted.append(directory)
    if uncommitted or expired:
        logger.info(
            "Storage sweep: %d uncommitted checkpoint directories and %d expired runs removed",
            len(uncommitted),
            len(expired),
        )
    return Sweep(tuple(uncommitted), tuple(expired))


def _is_uuid(text: str) -> bool:
    try:
        UUID(text)
    except ValueError:
        return False
    return True


def _newest(fs: fsspec.AbstractFileSystem, path: str) -> float:
    """When the newest file under ``path`` was written (0 when none says)."""
    stamps = []
    for info in fs.find(path, detail=True).values():
        modified = info.get("mtime") or info.get("LastModified") or info.get("created")
        if hasattr(modified, "timestamp"):
            stamps.append(modified.timestamp())
        elif isinstance(modified, (int, float)):
            stamps.append(float(modified))
    return max(stamps, default=0.0)


@task(name="sweep-storage", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def sweep_storage_task(runs_uri: str) -> Sweep:
    """The runs under ``runs_uri`` swept (``sweep_runs``) with the retention of
    ``retention_days``: the sweep-storage flow's, on its own schedule."""
    return sweep_runs(runs_uri, ended, retention_days() * 86400)


@task(name="tidy-storage", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def tidy_storage_task(runs_uri: str, run_uri: str, registered_uri: str) -> Sweep:
    """After a publish: the published run keeps its registered checkpoint only, and the runs
    that ended before are swept (``sweep_runs``, with the retention of ``retention_days``)."""
    prune_published(run_uri, registered_uri)
    return sweep_runs(runs_uri, ended, retention_days() * 86400)
