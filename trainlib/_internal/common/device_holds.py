"""A GPU held on its host by the rank that uses it, whatever Dask scheduler started the rank.

The claims on a scheduler (``driver/gpu_claims.py``) keep the runs of one cluster apart; two
``fit()`` calls with their own ``LocalCluster`` on one workstation, or two users' clusters on one
node, share no scheduler. So a rank also holds an advisory file lock (``flock``) named after its
device (``devices.device_key`` without the host) from before it touches CUDA until it exits: the
kernel releases it when the process ends, however it ends. Placement asks each worker which of
its devices are held (``holders``) and gives none of those.

The lock files live in ``$TRAINLIB_GPU_LOCK_DIR``, else ``/run/lock/trainlib-gpu-locks``
(``/dev/shm`` where there is no ``/run/lock``): one folder for the whole host, never the temp
folder, which differs per SLURM job (``TMPDIR``), per user and per service. Containers that
share a GPU must mount one host folder there. A folder where locks cannot be taken (read-only,
not a folder, a filesystem without ``flock``) fails with one message naming it and the setting,
never silently. A holder is named by its process id, host and pid namespace (a container's pids
are its own).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

LOCK_DIR_VARIABLE = "TRAINLIB_GPU_LOCK_DIR"
HOLD_VARIABLE = "TRAINLIB_GPU_HOLD"  # the device a rank holds: set by its supervisor
_HELD: list[int] = []  # this process's holds: open for its whole life
_WAIT_S = 2.0  # a placement's probe holds a lock for microseconds


class DeviceBusy(RuntimeError):
    """Another process on this host holds the device."""


class LockFolderError(RuntimeError):
    """GPU locks cannot be taken in the lock folder; the message names it and the setting."""


def default_lock_dir() -> Path:
    """``/run/lock/trainlib-gpu-locks``, or under ``/dev/shm`` where there is no ``/run/lock``."""
    run_lock = Path("/run/lock")
    return (run_lock if run_lock.is_dir() else Path("/dev/shm")) / "trainlib-gpu-locks"


def lock_dir() -> Path:
    """The folder of this host's GPU lock files (made, open to every user, if missing).

    Raises:
        LockFolderError: It cannot be made.
    """
    folder = Path(os.environ.get(LOCK_DIR_VARIABLE) or default_lock_dir())
    if not folder.is_dir():
        with _lock_folder(folder):
            folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a folder another user made
            folder.chmod(0o1777)  # every user's ranks lock here; none removes another's file
    return folder


@contextlib.contextmanager
def _lock_folder(folder: Path) -> Iterator[None]:
    """An OSError inside (but a held lock's) as one LockFolderError naming ``folder``."""
    try:
        yield
    except BlockingIOError:
        raise
    except OSError as error:
        name = errno.errorcode.get(error.errno or 0, "error")
        raise LockFolderError(
            f"GPU locks cannot be taken in {folder} ({name}: {error.strerror}): ranks on a host "
            f"lock their GPUs there with flock. Set {LOCK_DIR_VARIABLE} to a local folder that "
            "every scheduler, user and container on the host shares (not a network filesystem "
            "without flock, not a read-only or per-job temp folder)."
        ) from None


def hold(name: str) -> None:
    """Hold device ``name`` until this process ends.

    Raises:
        DeviceBusy: Another process holds it, named by its process id, host and pid namespace.
        LockFolderError: Locks cannot be taken in the lock folder.
    """
    fd = _open(name)
    deadline = time.monotonic() + _WAIT_S
    while True:
        try:
            with _lock_folder(lock_dir()):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                raise DeviceBusy(f"GPU {name} is held on this host by {holder}") from None
            time.sleep(0.05)
        except LockFolderError:
            os.close(fd)
            raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {_pid_namespace()}\n".encode(), 0)
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
            with _lock_folder(lock_dir()):
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
    with _lock_folder(path.parent):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's file
            return os.open(path, os.O_RDONLY)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. pid:[4026531836]
    except OSError:
        return "pid:[unknown]"


def _holder(fd: int) -> str:
    """Who holds the lock of ``fd``: its process id, with its host and pid namespace where
    they are not this process's (a container's pids are its own)."""
    try:
        fields = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        fields = []
    if not fields or not fields[0].isdigit():
        return "another process"
    pid, host, namespace = [*fields, "", ""][:3]
    where = []
    if host and host != socket.gethostname():
        where.append(f"on host {host}")
    if namespace and namespace != _pid_namespace():
        where.append(f"in pid namespace {namespace} (another container's)")
    return " ".join([f"process {pid}", *where])
