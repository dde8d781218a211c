"""A new Prefect sqlite database, copied from a template instead of migrated.

Prefect creates its database on a server's first start: about 150 Alembic migrations, then the
block registrations, two thirds of a temporary server's start-up. A database Prefect has just
made holds only that, so a copy of it is as good. The template is kept in the user's cache
(``$XDG_CACHE_HOME``, else ``~/.cache``), one per Prefect version and set of installed Prefect
collections (packages that add block types). A server started on a copy finds it at the newest
migration with its blocks registered, and is told not to register them again (1.4 s). Every
copy is a sqlite backup (consistent, even of a database in use), checked, then renamed into
place: a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import sqlite3
from pathlib import Path

import prefect


def path() -> Path:
    """The template of this Prefect version and these Prefect collections (packages that add
    block types, e.g. prefect-aws): a server on a copy registers no blocks."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    collections = sorted(
        f"{point.dist.name}=={point.dist.version}" if point.dist else point.value
        for point in importlib.metadata.entry_points(group="prefect.collections")
    )
    key = hashlib.sha256("\n".join(collections).encode()).hexdigest()[:12]
    return cache / "dask-train-cifar" / f"prefect-{prefect.__version__}-{key}.db"


def copy_to(database: Path) -> bool:
    """Make ``database`` from the template; False where there is no usable template (none yet,
    or a damaged one): Prefect then makes the database itself."""
    template = path()
    if not template.exists():
        return False
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        _copy(template, database)
    except (OSError, sqlite3.Error):
        return False
    return True


def save_from(database: Path) -> None:
    """Make the template from a database Prefect has just made. A failure is harmless (the next
    new database is migrated again), so it is ignored."""
    template = path()
    with contextlib.suppress(OSError, sqlite3.Error):
        template.parent.mkdir(parents=True, exist_ok=True)
        _copy(database, template)


def _copy(source: Path, target: Path) -> None:
    """Copy a migrated, empty Prefect database; raise sqlite3.Error for anything else."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with (
            contextlib.closing(sqlite3.connect(source)) as src,
            contextlib.closing(sqlite3.connect(partial)) as dst,
        ):
            src.backup(dst)
            (migrations,) = dst.execute("SELECT count(*) FROM alembic_version").fetchone()
            (flow_runs,) = dst.execute("SELECT count(*) FROM flow_run").fetchone()
        if migrations != 1 or flow_runs != 0:
            raise sqlite3.DatabaseError(f"{source} is not a new Prefect database")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
