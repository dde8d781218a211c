"""Blocks handed from a supervisor to its rank through shared memory instead of a pickle.

The supervisor writes a block's arrays into a memory file (``memfd_create``) of its own and
sends the rank only where they lie; the rank, on the same host, opens that file through
``/proc/<supervisor pid>/fd/<fd>`` while it unpickles the message and reads the arrays into
arrays of its own. Before this, a block of 2,500 CIFAR images (7.7 MB) was pickled twice in the
supervisor (15 ms, holding the GIL of the process that also runs the Dask worker and scheduler)
and copied four times in the rank (benchmarks/ingest.py).

A memory file is freed with the last descriptor of it: nothing is left behind when a process
dies, and no size limit of ``/dev/shm`` applies. ``SharedSlots`` reuses a file once the rank is
known to have read it, so a pass streams through one file per dataset (its pages allocated
once). Linux only; elsewhere, or for a block with Python objects in it, blocks are pickled.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

Block = dict[str, np.ndarray]
Column = tuple[str, str, tuple[int, ...], int, int]  # name, dtype, shape, offset, bytes
_ALIGN = 64


def available() -> bool:
    """Whether this process can hand blocks over in memory files (Linux, /proc mounted)."""
    return (
        sys.platform == "linux"
        and hasattr(os, "memfd_create")
        and os.path.isdir(f"/proc/{os.getpid()}/fd")
    )


def shareable(block: Block) -> bool:
    """Whether every column is plain numbers (object and record columns are pickled)."""
    return all(
        isinstance(v, np.ndarray) and not v.dtype.hasobject and v.dtype.fields is None
        for v in block.values()
    )


class SharedBlock:
    """A block in a memory file of process ``pid``; unpickles, in the rank, as the block."""

    def __init__(self, pid: int, fd: int, columns: tuple[Column, ...]) -> None:
        self.pid, self.fd, self.columns = pid, fd, columns

    def __reduce__(self) -> tuple[Any, tuple[int, int, tuple[Column, ...]]]:
        return read_block, (self.pid, self.fd, self.columns)


class SharedSlots:
    """Memory files for one stream of blocks to one rank, reused once the rank read them.

    ``put`` writes a block into a free file (a new one if none is free) and marks it sent;
    ``received`` frees every file sent so far (the caller knows the rank read them all);
    ``close`` closes every file (the rank can read none of them afterwards).
    """

    def __init__(self) -> None:
        self._free: list[int] = []
        self._sent: list[int] = []

    def put(self, block: Block) -> SharedBlock:
        fd = self._free.pop() if self._free else os.memfd_create("trainlib-block", os.MFD_CLOEXEC)
        self._sent.append(fd)
        columns, offset = [], 0
        for name, values in block.items():
            array = np.ascontiguousarray(values)
            data = array.reshape(-1).view(np.uint8)
            _write_all(fd, data, offset)
            columns.append((name, array.dtype.str, array.shape, offset, data.nbytes))
            offset += -(-data.nbytes // _ALIGN) * _ALIGN
        return SharedBlock(os.getpid(), fd, tuple(columns))

    def received(self) -> None:
        self._free.extend(self._sent)
        self._sent.clear()

    def release_free(self) -> None:
        """Close the files not in flight (between passes: no memory held while idle)."""
        for fd in self._free:
            os.close(fd)
        self._free.clear()

    def close(self) -> None:
        self.received()
        self.release_free()


def read_block(pid: int, fd: int, columns: tuple[Column, ...]) -> Block | Exception:
    """The block in memory file ``fd`` of process ``pid``, as arrays of this process.

    Runs as the rank unpickles the message, in the thread that reads its connection, which
    must not raise: a failure comes back as the error, which the rank's iterator raises.
    """
    try:
        handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        from trainlib.errors import DatasetError

        return DatasetError(
            f"Cannot read a block of data from the supervisor (process {pid}) through shared "
            f"memory: {exc}. Ranks read blocks from /proc/<pid>/fd of their supervisor, on the "
            "same host and as the same user."
        )
    try:
        block = {}
        for name, dtype, shape, offset, nbytes in columns:
            array = np.empty(shape, np.dtype(dtype))
            _read_all(handle, array.reshape(-1).view(np.uint8), offset, nbytes)
            block[name] = array
        return block
    except OSError as exc:
        from trainlib.errors import DatasetError

        return DatasetError(f"Reading a block of data from shared memory failed: {exc}")
    finally:
        os.close(handle)


def _write_all(fd: int, data: np.ndarray, offset: int) -> None:
    view, done = memoryview(data.data), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def _read_all(fd: int, data: np.ndarray, offset: int, nbytes: int) -> None:
    view, done = memoryview(data.data), 0
    while done < nbytes:
        read = os.preadv(fd, [view[done:]], offset + done)
        if read == 0:
            raise OSError(f"the block ends {nbytes - done} bytes early")
        done += read
