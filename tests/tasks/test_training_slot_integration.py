"""The training slot, held by the cluster's Dask scheduler and, for loopback clusters, by the
host (no Prefect involved): a second training waits for the first, on one cluster or on two
runs' own LocalClusters (its lease: test_training_slot_lease_integration)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from distributed import Client

from tasks.training_slot import on_loopback, training_slot, training_slots
from trainlib import DaskConfig


@pytest.fixture(autouse=True)
def _own_host_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's host slot files (not those of other jobs on the machine)."""
    monkeypatch.setenv("CIFAR_TRAINING_LOCK_DIR", str(tmp_path / "slots"))


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


def test_training_slot_count_comes_from_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CIFAR_TRAINING_SLOTS", raising=False)
    assert training_slots() == 1
    monkeypatch.setenv("CIFAR_TRAINING_SLOTS", "2")
    assert training_slots() == 2
    monkeypatch.setenv("CIFAR_TRAINING_SLOTS", "two")
    with pytest.raises(ValueError, match="CIFAR_TRAINING_SLOTS='two' must be a whole number"):
        training_slots()


def test_training_slot_is_held_across_loopback_clusters() -> None:
    """Two runs' own LocalClusters on this host share no scheduler: the host's slot file keeps
    their trainings apart."""
    inside: list[str] = []
    overlap = threading.Event()
    first_in = threading.Event()
    with (
        DaskConfig().connect(num_workers=1) as one,
        DaskConfig().connect(num_workers=1) as other,
    ):
        assert one.scheduler is not None and other.scheduler is not None
        one_address, other_address = one.scheduler.address, other.scheduler.address
        assert one_address != other_address

        def train(address: str, name: str, seconds: float) -> None:
            with training_slot(DaskConfig(address=address), name):
                if inside:
                    overlap.set()
                inside.append(name)
                first_in.set()
                time.sleep(seconds)
                inside.remove(name)

        first = threading.Thread(target=train, args=(one_address, "first", 2.0))
        first.start()
        first_in.wait(timeout=60)
        second = threading.Thread(target=train, args=(other_address, "second", 0.1))
        started = time.monotonic()
        second.start()
        first.join()
        second.join()
    assert not overlap.is_set()
    assert time.monotonic() - started >= 1.0  # the second waited for the first's 2 s


def test_training_slot_host_lock_only_for_loopback_schedulers() -> None:
    assert on_loopback("tcp://127.0.0.1:8786")
    assert on_loopback("tls://localhost:8786")
    assert on_loopback("tcp://[::1]:8786")
    assert not on_loopback("tls://dask-scheduler:8786")
    assert not on_loopback("tcp://10.0.0.5:8786")
    assert on_loopback("inproc://10.0.0.5/1/2")  # in this process


def test_training_tasks_take_no_prefect_slot() -> None:
    """A tagged task's slots are asked of the Prefect API by a client that gives up at once
    while the server is down (the soak's Failed run): the trainings carry no tag."""
    from tasks.train import train_task
    from tasks.tune import tune_task

    assert train_task.tags == set()
    assert tune_task.tags == set()
