"""Where a path or URL points: its fsspec filesystem and the path on it.

This is the one place trainlib uses fsspec without a public API: a filesystem given with a
path (``RunConfig(storage_filesystem=...)``, ``Result.from_path(..., storage_filesystem=...)``)
has the path's protocol stripped by that filesystem's own ``_strip_protocol``, as fsspec itself
does in ``url_to_fs``; fsspec offers no public call that strips a protocol for a given
filesystem (``fsspec.core.strip_protocol`` picks the class by the protocol, so a path without
one would be taken as a local path). ``tests/trainlib/test_locations.py``
fails on an fsspec where it moved.
"""

from __future__ import annotations

import os

import fsspec
from fsspec import AbstractFileSystem


def locate(
    path: str | os.PathLike[str], filesystem: AbstractFileSystem | None = None
) -> tuple[AbstractFileSystem, str]:
    """``path``'s filesystem (``filesystem``, else inferred from its protocol; ``~`` expanded)
    and the path on it, without the protocol."""
    if filesystem is None:
        found, where = fsspec.core.url_to_fs(os.path.expanduser(os.fspath(path)))
        return found, str(where)
    return filesystem, str(filesystem._strip_protocol(os.fspath(path)))
