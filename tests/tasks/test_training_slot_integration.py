"""The cluster's training slot, held by its Dask scheduler (no Prefect involved): a second
training waits for the first, and a driver that dies frees it within the lease timeout."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from distributed import Client

from tasks.training_slot import training_slot, training_slots
from trainlib import DaskConfig

HOLDER = """
import sys, time
from tasks.training_slot import training_slot
from trainlib import DaskConfig
with training_slot(DaskConfig(address=sys.argv[1]), "killed"):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_training_slot_a_second_training_waits_for_the_first(dask_client: Client) -> None:
    config = DaskConfig(address=dask_client.scheduler.address)
    inside: list[str] = []
    overlap = threading.Event()
    first_in = threading.Event()

    def train(name: str, seconds: float) -> None:
        with training_slot(config, name):
            if inside:
                overlap.set()
            inside.append(name)
            first_in.set()
            time.sleep(seconds)
            inside.remove(name)

    first = threading.Thread(target=train, args=("first", 2.0))
    first.start()
    first_in.wait(timeout=60)
    second = threading.Thread(target=train, args=("second", 0.1))
    started = time.monotonic()
    second.start()
    first.join()
    second.join()
    assert not overlap.is_set()
    assert time.monotonic() - started >= 1.0  # the second waited for the first's 2 s


def test_training_slot_of_a_killed_driver_frees_within_the_lease_timeout(
    dask_client: Client, tmp_path: Path
) -> None:
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(HOLDER))
    repo = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, str(script), dask_client.scheduler.address],
        cwd=repo,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        holder.kill()
        holder.wait()
        killed = time.monotonic()
        with training_slot(DaskConfig(address=dask_client.scheduler.address), "next"):
            freed_after = time.monotonic() - killed
    finally:
        holder.kill()
        holder.wait()
    assert freed_after < 60.0  # lease-timeout 30 s, validated every 10 s


def test_training_slot_count_comes_from_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CIFAR_TRAINING_SLOTS", raising=False)
    assert training_slots() == 1
    monkeypatch.setenv("CIFAR_TRAINING_SLOTS", "2")
    assert training_slots() == 2
    monkeypatch.setenv("CIFAR_TRAINING_SLOTS", "two")
    with pytest.raises(ValueError, match="CIFAR_TRAINING_SLOTS='two' must be a whole number"):
        training_slots()
