"""A rank's hold on its GPU, across processes of one host: seen by every other process, refused
to a second holder naming the first, and gone when the holder dies, however it dies."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainlib._internal.common import device_holds

HOLD_AND_WAIT = (
    "import sys\n"
    "from trainlib._internal.common import device_holds\n"
    "device_holds.hold(sys.argv[1])\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_device_holds_one_holder_per_device_named_to_others_and_gone_with_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(device_holds.LOCK_DIR_VARIABLE, str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, "GPU-aaaa0000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        seen = device_holds.holders(["GPU-aaaa0000", "GPU-bbbb1111"])
        assert seen == {"GPU-aaaa0000": f"process {holder.pid}"}
        second = subprocess.run(
            [sys.executable, "-c", HOLD_AND_WAIT, "GPU-aaaa0000"],
            capture_output=True,
            text=True,
            env={**os.environ},
            timeout=60,
        )
        assert second.returncode == 1
        assert f"DeviceBusy: GPU GPU-aaaa0000 is held on this host by process {holder.pid}" in (
            second.stderr
        )
    finally:
        holder.kill()  # SIGKILL: no cleanup code runs; the kernel drops the lock
        holder.wait()
    assert device_holds.holders(["GPU-aaaa0000"]) == {}


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_device_holds_a_rank_given_a_held_gpu_fails_naming_the_holder_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(device_holds.LOCK_DIR_VARIABLE, str(tmp_path))
    code = (
        "import os\n"
        "from trainlib._internal.rank import backend\n"
        "backend.init_process_group('gloo', 5, use_gpu=True, host='n1')\n"
    )
    env = {**os.environ, device_holds.HOLD_VARIABLE: "GPU-aaaa0000", "RANK": "3"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, "GPU-aaaa0000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        rank = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
    finally:
        holder.kill()
        holder.wait()
    last = rank.stderr.strip().splitlines()[-1]
    assert last == (
        f"RuntimeError: Rank 3 on host n1: GPU GPU-aaaa0000 is held on this host by process "
        f"{holder.pid} (a run of another Dask scheduler on this host, or a process that kept "
        "it); wait for it to end, or give this run's workers other GPUs."
    )


def test_device_holds_default_folder_is_one_per_host_not_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SLURM job's TMPDIR (and a user's, a service's) differs: the default does not follow."""
    monkeypatch.delenv(device_holds.LOCK_DIR_VARIABLE, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    folder = device_holds.lock_dir()
    assert folder == device_holds.default_lock_dir()
    assert str(folder).startswith(("/run/lock/", "/dev/shm/")) and tmp_path not in folder.parents


@pytest.mark.parametrize("where", ["a file", "under a file", "/proc"])
def test_device_holds_a_folder_where_locks_cannot_be_taken_names_it_and_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    (tmp_path / "file").write_text("")
    folder = {
        "a file": tmp_path / "file",
        "under a file": tmp_path / "file" / "locks",
        "/proc": Path("/proc/trainlib-gpu-locks"),  # a filesystem where nothing is created
    }[where]
    monkeypatch.setenv(device_holds.LOCK_DIR_VARIABLE, str(folder))
    for attempt in (lambda: device_holds.hold("GPU-cccc2222"), lambda: device_holds.holders(["x"])):
        with pytest.raises(device_holds.LockFolderError) as caught:
            attempt()
        assert str(folder) in str(caught.value) and "TRAINLIB_GPU_LOCK_DIR" in str(caught.value)


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EBADF])
def test_device_holds_a_filesystem_without_flock_fails_with_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """As flock(2) documents: Lustre mounted without -o flock answers ENOSYS, NFS without a lock
    manager ENOLCK."""
    monkeypatch.setenv(device_holds.LOCK_DIR_VARIABLE, str(tmp_path))

    def flock(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(device_holds.fcntl, "flock", flock)
    with pytest.raises(device_holds.LockFolderError, match=errno.errorcode[code]) as caught:
        device_holds.hold("GPU-dddd3333")
    assert str(tmp_path) in str(caught.value)


def test_device_holds_a_holder_in_another_pid_namespace_is_named_so(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.write_text(f"4242 {socket.gethostname()} pid:[1]\n")
    fd = os.open(lock, os.O_RDONLY)
    try:
        assert device_holds._holder(fd) == (
            "process 4242 in pid namespace pid:[1] (another container's)"
        )
    finally:
        os.close(fd)
