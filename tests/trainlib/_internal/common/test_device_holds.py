"""A rank's hold on its GPU, across processes of one host: seen by every other process, refused
to a second holder naming the first, and gone when the holder dies, however it dies."""

from __future__ import annotations

import os
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
