"""Blocks handed to the rank in memory files: read back equal, files reused once read."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from trainlib import DatasetError
from trainlib._internal.common import shared_blocks

pytestmark = pytest.mark.skipif(not shared_blocks.available(), reason="Linux memory files")


def test_shared_block_unpickles_as_an_equal_writable_block() -> None:
    slots = shared_blocks.SharedSlots()
    block: dict[str, np.ndarray] = {
        "image": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        "label": np.array([7, 9], dtype=np.int64)[::-1],  # not contiguous
        "empty": np.zeros((2, 0), np.float32),
    }
    read: dict[str, np.ndarray] = pickle.loads(pickle.dumps(("d", slots.put(block)), protocol=4))[1]
    assert set(read) == set(block)
    for name, values in block.items():
        assert read[name].dtype == values.dtype and np.array_equal(read[name], values)
        assert read[name].flags.writeable
    slots.close()


def test_shared_slots_reuse_a_file_only_once_read() -> None:
    slots = shared_blocks.SharedSlots()
    first = slots.put({"x": np.ones(4)})
    second = slots.put({"x": np.zeros(4)})  # the first is not known to be read: another file
    assert first.fd != second.fd
    slots.received()
    assert slots.put({"x": np.ones(4)}).fd in (first.fd, second.fd)
    files = {_identity(first.fd), _identity(second.fd)}
    slots.close()
    # Both memory files are closed. (Not checked by reading fd numbers again: another thread of
    # this process may have been given the same number for a file of its own since.)
    assert files.isdisjoint(_open_files())


def _identity(fd: int) -> tuple[int, int]:
    """The file open as ``fd`` in this process: its device and inode."""
    found = os.fstat(fd)
    return found.st_dev, found.st_ino


def _open_files() -> set[tuple[int, int]]:
    """Every file open in this process, as ``_identity`` names them."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            stat = os.stat(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile, or listdir's own descriptor
            continue
        found.add((stat.st_dev, stat.st_ino))
    return found


def test_object_columns_are_not_shared() -> None:
    assert shared_blocks.shareable({"x": np.zeros(2)})
    assert not shared_blocks.shareable({"x": np.array([b"a", None], dtype=object)})


def test_an_unreadable_file_is_an_error_the_rank_raises() -> None:
    error = shared_blocks.read_block(os.getpid(), 10_000, (("x", "<f8", (1,), 0, 8),))
    assert isinstance(error, DatasetError) and "shared memory" in str(error)
