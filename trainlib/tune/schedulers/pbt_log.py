"""PBT's records, as Ray writes them in the search's directory: each exploit one line of
``pbt_global.txt``, and ``pbt_policy_{trial}.txt`` the history of the config a trial runs
(the donor's history, with this exploit's line). Each file is written whole: object stores
have no append."""

from __future__ import annotations

import posixpath

from fsspec import AbstractFileSystem

GLOBAL_LOG = "pbt_global.txt"


def record(filesystem: AbstractFileSystem, log_dir: str, trial: str, donor: str, line: str) -> None:
    """Record ``line``, the exploit of ``donor`` by ``trial`` (the trial keeps its own history
    where the donor has none)."""
    global_log = posixpath.join(log_dir, GLOBAL_LOG)
    _append(filesystem, global_log, _read(filesystem, global_log), line)
    donor_file, own_file = _policy_file(log_dir, donor), _policy_file(log_dir, trial)
    history = donor_file if filesystem.exists(donor_file) else own_file
    _append(filesystem, own_file, _read(filesystem, history), line)


def _policy_file(log_dir: str, trial: str) -> str:
    return posixpath.join(log_dir, f"pbt_policy_{trial}.txt")


def _read(filesystem: AbstractFileSystem, path: str) -> str:
    try:
        return str(filesystem.cat_file(path).decode())
    except FileNotFoundError:
        return ""


def _append(filesystem: AbstractFileSystem, path: str, before: str, line: str) -> None:
    filesystem.pipe_file(path, f"{before}{line}\n".encode())
