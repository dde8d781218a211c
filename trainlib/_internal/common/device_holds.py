"""A GPU held on its host by the rank that uses it, whatever Dask scheduler started the rank.

The claims on a scheduler (``driver/gpu_claims.py``) keep the runs of one cluster apart; two
``fit()`` calls with their own ``LocalCluster`` on one workstation, or two users' clusters on one
node, share no scheduler. So a rank also holds an advisory file lock (``flock``) named after its
device (``devices.device_key`` without the host) from before it touches CUDA until it exits: the
kernel releases it when the process ends, however it ends. Placement asks each worker which of
its devices are held (``holders``) and gives none of those.

The lock files live in ``$TRAINLIB_GPU_LOCK_DIR``, else ``<temp dir>/trainlib-gpu-locks``: one
folder per filesystem, so containers that share a GPU must share that folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

LOCK_DIR_VARIABLE = "TRAINLIB_GPU_LOCK_DIR"
HOLD_VARIABLE = "TRAINLIB_GPU_HOLD"  # the device a rank holds: set by its supervisor
_HELD: list[int] = []  # this process's holds: open for its whole life
_WAIT_S = 2.0  # a placement's probe holds a lock for microseconds


class DeviceBusy(RuntimeError):
    """Another process on this host holds the device."""


def lock_dir() -> Path:
    """The folder of this host's GPU lock files (made, open to every user, if missing)."""
    folder = Path(
        os.environ.get(LOCK_DIR_VARIABLE) or Path(tempfile.gettempdir(), "trainlib-gpu-locks")
    )
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a folder another user made
            folder.chmod(0o1777)  # every user's ranks lock here; none removes another's file
    return folder


def hold(name: str) -> None:
    """Hold device ``name`` until this process ends.

    Raises:
        DeviceBusy: Another process holds it, named by its process id.
    """
    fd = _open(name)
    deadline = time.monotonic() + _WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                raise DeviceBusy(f"GPU {name} is held on this host by {holder}") from None
            time.sleep(0.05)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:  # a lock file of another user's, opened read-only: held all the same
        pass
    _HELD.append(fd)


def holders(names: Iterable[str]) -> dict[str, str]:
    """Of ``names``, the devices some process on this host holds now, with who holds each."""
    found = {}
    for name in names:
        path = _path(name)
        if not path.exists():
            continue
        fd = _open(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            found[name] = _holder(fd)
        finally:
            os.close(fd)
    return found


def _path(name: str) -> Path:
    return lock_dir() / f"{name.replace('/', '_')}.lock"


def _open(name: str) -> int:
    path = _path(name)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's file
        return os.open(path, os.O_RDONLY)


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        pid = ""
    return f"process {pid}" if pid.isdigit() else "another process"
