"""GPU placement on a real Dask cluster with faked device discovery: runs of any client never
share a GPU, whatever joins, restarts or leaves between and during their selections."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client, Worker

from tests.helpers import free_port, local_cluster
from tests.trainlib._internal.common.fake_nvml import ProcessInfo, fake_nvml, install
from trainlib import NotEnoughWorkersError, ScalingConfig
from trainlib._internal.common import device_holds, gpu_discovery, gpu_users
from trainlib._internal.driver import worker_selection
from trainlib._internal.driver.gpu_claims import GpuClaims
from trainlib._internal.driver.ranks import WorkerSlot
from trainlib._internal.driver.worker_selection import select_workers

GPU = ScalingConfig(num_workers=2, use_gpu=True)
_real_nvml_devices = gpu_discovery.nvml_devices


@dataclass
class Rig:
    """A scheduler and four single-threaded workers (in this process) whose addresses sort
    in start order, on a host that seems to have four NVIDIA GPUs."""

    scheduler: str  # its address, for more clients of the cluster
    client: Client
    ports: list[int]  # ascending; the workers listen on the first four
    workers: list[Worker]

    def start_worker(self, port: int) -> Worker:
        worker: Worker = self.client.sync(_start_worker, self.scheduler, port)
        self.workers.append(worker)
        return worker

    def stop_worker(self, address: str) -> None:
        self.client.sync(next(w for w in self.workers if w.address == address).close)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Rig]:
    folder = tmp_path / "gpus"
    for index in range(4):
        (folder / f"0000:0{index}:00.0").mkdir(parents=True)
    monkeypatch.setattr(gpu_discovery, "_NVIDIA_GPUS_DIR", str(folder))
    monkeypatch.setattr(gpu_discovery, "nvml_devices", lambda: None)  # the folder, not NVML
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with local_cluster(0, processes=False) as client:
        rig = Rig(
            client.scheduler_info()["address"], client, sorted(free_port() for _ in range(5)), []
        )
        try:
            for port in rig.ports[:4]:
                rig.start_worker(port)
            yield rig
        finally:
            for worker in rig.workers:
                client.sync(worker.close)


def _gpus(slots: list[WorkerSlot]) -> set[str | None]:
    return {slot.device for slot in slots}


def test_two_runs_of_two_clients_take_different_gpus_and_a_third_is_told_who_holds_them(
    rig: Rig,
) -> None:
    cluster = rig.scheduler
    with (
        Client(cluster) as first_client,
        Client(cluster) as second_client,
        GpuClaims(first_client, "run-a") as first,
        GpuClaims(second_client, "run-b") as second,
    ):
        a = select_workers(first_client, GPU, timeout_s=5, claims=first)
        b = select_workers(second_client, GPU, timeout_s=5, claims=second)
        assert _gpus(a) == {"0", "1"} and _gpus(b) == {"2", "3"}
        one = ScalingConfig(num_workers=1, use_gpu=True)
        with GpuClaims(rig.client, "run-c") as third:
            with pytest.raises(
                NotEnoughWorkersError,
                match=r"needs 1 free GPU\(s\) but \S+ has 0 \(GPU \S+/0 is used by run run-a; "
                r".*GPU \S+/3 is used by run run-b\); wait for them to end",
            ):
                select_workers(rig.client, one, timeout_s=60, claims=third)
            assert third.held == set()
        second.release()
        with GpuClaims(rig.client, "run-c") as third:
            assert _gpus(select_workers(rig.client, GPU, 5, claims=third)) == {"2", "3"}


def test_a_worker_restarted_between_two_runs_does_not_give_the_second_a_gpu_in_use(
    rig: Rig,
) -> None:
    first_worker, second_worker, third_worker, fourth_worker = sorted(
        worker_selection.worker_statuses(rig.client)
    )
    with GpuClaims(rig.client, "run-a") as first:
        held = {third_worker, fourth_worker}
        a = select_workers(rig.client, GPU, 5, allowed=lambda e: held & set(e), claims=first)
        assert _gpus(a) == {"2", "3"}
        # the first worker restarts on a new port: the second now sorts first, the restarted
        # one last, at the position that offers GPU 3 (in use by run-a)
        rig.stop_worker(first_worker)
        restarted = rig.start_worker(rig.ports[4]).address
        free = {second_worker, restarted}
        with GpuClaims(rig.client, "run-b") as second:
            b = select_workers(rig.client, GPU, 5, allowed=lambda e: free & set(e), claims=second)
        assert {s.address for s in b} == free
        assert not _gpus(a) & _gpus(b)


def test_a_worker_leaving_between_the_scheduler_read_and_the_device_probe_is_passed_over(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = sorted(worker_selection.worker_statuses(rig.client))[0]
    read = worker_selection._workers
    lost: list[str] = []

    def read_then_lose_one(client: Client) -> dict[str, Any]:
        live = read(client)
        if not lost:  # the scheduler answered with the worker; it leaves right after
            lost.append(gone)
            rig.stop_worker(gone)
        return live

    monkeypatch.setattr(worker_selection, "_workers", read_then_lose_one)
    # the probe of the gone worker gives up after the connect timeout (30 s by default)
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        slots = select_workers(rig.client, GPU, timeout_s=5)
    assert lost and gone not in {slot.address for slot in slots}
    assert len(_gpus(slots)) == 2


@pytest.mark.parametrize("hidden", ["-1", "NoDevFiles"])
def test_workers_that_hide_their_gpus_are_never_picked(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, hidden: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    with pytest.raises(NotEnoughWorkersError, match=r"has 0 CUDA device\(s\) for its 4 Dask"):
        select_workers(rig.client, GPU, timeout_s=60)


async def _start_worker(scheduler_address: str, port: int) -> Worker:
    return await Worker(scheduler_address, nthreads=1, host="127.0.0.1", port=port, protocol="tcp")


def test_a_trial_waits_for_gpus_in_use_then_names_who_holds_them(rig: Rig) -> None:
    every = set(worker_selection.worker_statuses(rig.client))
    with Client(rig.scheduler) as other_client, GpuClaims(other_client, "run-a") as other:
        select_workers(other_client, ScalingConfig(num_workers=4, use_gpu=True), 5, claims=other)
        started = time.monotonic()
        with (
            GpuClaims(rig.client, "trial_00000") as trial,
            pytest.raises(NotEnoughWorkersError, match=r"GPU \S+/0 is used by run run-a"),
        ):
            select_workers(rig.client, GPU, 1.0, allowed=lambda e: every & set(e), claims=trial)
        assert time.monotonic() - started >= 1.0  # a trial waits; a plain fit fails at once


def test_a_search_short_of_gpu_workers_is_told_which_hosts_lack_devices(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # every worker offers the same one GPU
    error = worker_selection.gpu_shortage(rig.client, GPU, available=1, timeout_s=5)
    assert error is not None
    assert re.search(r"host \S+ has 1 CUDA device\(s\) for its 4 Dask workers", str(error))
    assert worker_selection.gpu_shortage(rig.client, ScalingConfig(num_workers=5), 1, 5) is None


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_a_gpu_a_rank_of_another_scheduler_holds_is_never_given_and_its_holder_is_named(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another fit() on this host, with a LocalCluster of its own: its rank holds GPU 2
    monkeypatch.setenv("TRAINLIB_GPU_LOCK_DIR", str(tmp_path / "locks"))
    with _holding("2", tmp_path / "locks") as pid:
        three = ScalingConfig(num_workers=3, use_gpu=True)
        with GpuClaims(rig.client, "run-a") as claims:
            slots = select_workers(rig.client, three, timeout_s=5, claims=claims)
            assert _gpus(slots) == {"0", "1", "3"}
            assert {s.device_hold for s in slots} == {"0", "1", "3"}  # what each rank will hold
        four = ScalingConfig(num_workers=4, use_gpu=True)
        with (
            GpuClaims(rig.client, "run-b") as claims,
            pytest.raises(NotEnoughWorkersError, match=rf"GPU \S+/2 is used by process {pid} on"),
        ):
            select_workers(rig.client, four, timeout_s=60, claims=claims)
    # the holder gone (however it ended), the GPU is free again
    with GpuClaims(rig.client, "run-c") as claims:
        assert _gpus(select_workers(rig.client, four, timeout_s=5, claims=claims)) == {
            "0", "1", "2", "3",
        }  # fmt: skip


def test_a_gpu_another_process_uses_is_never_given_and_the_process_is_named(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A colleague's notebook on GPU 1 (NVML lists it; it holds no trainlib lock): no run gets
    GPU 1, and a run that needs it is told which process has it; once the process ends, the
    GPU is given again."""
    gpus = [{"uuid": f"GPU-{i}"} for i in range(4)]
    processes = {"GPU-1": [ProcessInfo(31337, 2**31)]}
    install(monkeypatch, fake_nvml(gpus, processes, {31337: "jupyter"}))
    monkeypatch.setattr(gpu_discovery, "nvml_devices", _real_nvml_devices)
    gpu_discovery._nvml_scan.cache_clear()
    try:
        three = ScalingConfig(num_workers=3, use_gpu=True)
        with GpuClaims(rig.client, "run-a") as claims:
            slots = select_workers(rig.client, three, timeout_s=5, claims=claims)
            assert _gpus(slots) == {"0", "2", "3"}
        four = ScalingConfig(num_workers=4, use_gpu=True)
        with (
            GpuClaims(rig.client, "run-b") as claims,
            pytest.raises(
                NotEnoughWorkersError,
                match=r"GPU \S+/GPU-1 is used by process 31337 \(jupyter, 2.0 GiB\), not a rank "
                r"of trainlib: stop it or give this run other GPUs",
            ),
        ):
            select_workers(rig.client, four, timeout_s=60, claims=claims)
        processes["GPU-1"].clear()  # the notebook ended
        with GpuClaims(rig.client, "run-c") as claims:
            assert _gpus(select_workers(rig.client, four, timeout_s=5, claims=claims)) == {
                "0", "1", "2", "3",
            }  # fmt: skip
        monkeypatch.setenv("TRAINLIB_GPU_OTHER_PROCESSES", "sometimes")
        with (
            GpuClaims(rig.client, "run-d") as claims,
            pytest.raises(gpu_users.OthersSettingError, match="TRAINLIB_GPU_OTHER_PROCESSES"),
        ):
            select_workers(rig.client, four, timeout_s=5, claims=claims)
    finally:
        gpu_discovery._nvml_scan.cache_clear()


def test_a_lock_folder_where_locks_cannot_be_taken_fails_placement_naming_it(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a worker silently left out: the host's setting is wrong, and the message says so."""
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("TRAINLIB_GPU_LOCK_DIR", str(tmp_path / "not-a-folder"))
    with (
        GpuClaims(rig.client, "run-a") as claims,
        pytest.raises(device_holds.LockFolderError, match="TRAINLIB_GPU_LOCK_DIR"),
    ):
        select_workers(rig.client, ScalingConfig(num_workers=1, use_gpu=True), 5, claims=claims)


@contextlib.contextmanager
def _holding(name: str, folder: Path) -> Iterator[int]:
    """A process that holds device ``name`` as a rank does, until it is SIGKILLed."""
    code = (
        "import sys\n"
        "from trainlib._internal.common import device_holds\n"
        f"device_holds.hold({name!r})\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "TRAINLIB_GPU_LOCK_DIR": str(folder)}
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"held\n"
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_a_claim_whose_holder_cannot_be_recorded_is_not_left_held(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scheduler refuses the holder's name (a fault injected into this client's call)
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("scheduler unreachable")

    with Client(rig.scheduler) as other:
        monkeypatch.setattr(other, "set_metadata", refuse)
        with GpuClaims(other, "run-a") as failing, pytest.raises(OSError):
            failing.take("h/0")
        with GpuClaims(rig.client, "run-b") as claims:
            assert claims.take("h/0")  # at once: the failed claim let go of the lock


def test_a_run_keeps_its_gpus_across_attempts_and_a_queued_run_never_takes_them(
    rig: Rig,
) -> None:
    """A restart (or an elastic re-form) places its ranks again with the run's claims: the
    GPUs its first attempt had stay its own in between, and it gets them back."""
    with Client(rig.scheduler) as other, GpuClaims(rig.client, "run-a") as run:
        first = select_workers(rig.client, GPU, timeout_s=5, claims=run)
        # the attempt failed and its ranks stopped; a queued run places meanwhile
        with GpuClaims(other, "run-b") as queued:
            four = ScalingConfig(num_workers=4, use_gpu=True)
            with pytest.raises(NotEnoughWorkersError, match=r"is used by run run-a"):
                select_workers(other, four, timeout_s=60, claims=queued)
            assert queued.held == set()  # all or nothing: not the two it could have had
        again = select_workers(rig.client, GPU, timeout_s=5, claims=run)
        assert _gpus(again) == _gpus(first) == {"0", "1"}
        assert len(run.held) == 2


def test_while_another_run_places_a_run_waits_and_is_not_told_of_a_shortage(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs place one at a time: two that each need every GPU, started together, never take
    some each and both fail. One placing holds the lock: the other is given nothing meanwhile
    and, at its timeout, told it waited for workers (not that GPUs are missing)."""
    from trainlib._internal.driver import gpu_claims

    monkeypatch.setattr(gpu_claims, "_PLACING_WAIT_S", 0.2)
    four = ScalingConfig(num_workers=4, use_gpu=True)
    with Client(rig.scheduler) as other, GpuClaims(other, "run-a") as placing_run:
        with placing_run.placing() as placing:  # run-a is half-way through its placement
            assert placing
            with GpuClaims(rig.client, "run-b") as waiting:
                with pytest.raises(NotEnoughWorkersError) as raised:
                    select_workers(rig.client, four, timeout_s=1.0, claims=waiting)
                assert "used by" not in str(raised.value)
                assert waiting.held == set() and waiting.refused == {}
        with GpuClaims(rig.client, "run-b") as after:  # the placement over, it places
            assert len(select_workers(rig.client, four, timeout_s=5, claims=after)) == 4


_SCHEDULER = (sys.executable, "-m", "distributed.cli.dask_scheduler", "--dashboard-address", ":0")


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_claims_of_a_client_whose_scheduler_restarted_are_taken_afresh() -> None:
    port = free_port()
    command = [*_SCHEDULER, "--host", "127.0.0.1", "--port", str(port)]
    scheduler = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        with (
            Client(f"tcp://127.0.0.1:{port}", timeout=30) as client,
            GpuClaims(client, "run-a") as claims,
        ):
            assert claims.take("h/GPU-0")
            scheduler.kill()
            scheduler.wait()
            scheduler = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            _reconnected(client)
            # the old claim's lock still refreshes its lease: the new scheduler counts it under
            # a name it does not know yet (a lease a plain release there leaves behind)
            _lease_reached_scheduler(client, "trainlib-gpu/h/GPU-0")
            assert claims.take("h/GPU-1")
            claims.release()  # the old claim's lease died with the old scheduler
            # the lock of GPU-0 was made (and registered) on the old scheduler: "Semaphore or
            # Lock `trainlib-gpu/h/GPU-0` not known" before, a fresh claim now
            assert claims.take("h/GPU-0")
            with Client(f"tcp://127.0.0.1:{port}", timeout=30) as other:
                assert not GpuClaims(other, "run-b").take("h/GPU-0")  # a claim again
    finally:
        scheduler.kill()
        scheduler.wait()


def _lease_reached_scheduler(client: Client, name: str) -> None:
    """Until the scheduler counts a lease under ``name`` (a lock's refresh every
    lease-timeout / 5 seconds sends it)."""

    def leases(dask_scheduler: Any) -> int:
        return len(dask_scheduler.extensions["semaphores"].leases.get(name, {}))

    deadline = time.monotonic() + 60
    while not client.run_on_scheduler(leases):
        assert time.monotonic() < deadline, f"no lease of {name} ever reached the scheduler"
        time.sleep(0.2)


def _reconnected(client: Client) -> None:
    """Until the client has found the restarted scheduler (Dask reconnects on its own)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            client.scheduler_info()
            if client.status == "running":
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the client never reconnected"
        time.sleep(0.2)


_DRIVER = """
import sys
from distributed import Client
from trainlib._internal.driver.gpu_claims import GpuClaims
client = Client(sys.argv[1], timeout=30)
assert GpuClaims(client, "run-a").take("h/GPU-0")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_the_claim_of_a_sigkilled_driver_lapses_with_its_lease() -> None:
    """The scheduler frees a dead driver's claims once their lease times out (the drivers'
    setting, shortened here from 30 s to 2 s); the GPU is then claimed by another run."""
    port = free_port()
    command = [*_SCHEDULER, "--host", "127.0.0.1", "--port", str(port)]
    lease = {
        "DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "2s",
        "DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_VALIDATION_INTERVAL": "0.5s",
    }
    scheduler = subprocess.Popen(command, env={**os.environ, **lease}, stderr=subprocess.DEVNULL)
    address = f"tcp://127.0.0.1:{port}"
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **lease},
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == b"held\n"
        with (
            dask.config.set({"distributed.scheduler.locks.lease-timeout": "2s"}),
            Client(address, timeout=30) as client,
            GpuClaims(client, "run-b") as claims,
        ):
            assert not claims.take("h/GPU-0")
            assert claims.refused == {"h/GPU-0": "run run-a"}
            driver.kill()
            driver.wait()
            killed = time.monotonic()
            while not claims.take("h/GPU-0"):  # until the scheduler finds the lease expired
                assert time.monotonic() - killed < 30, "the dead driver's claim never lapsed"
                time.sleep(0.2)
    finally:
        driver.kill()
        driver.wait()
        scheduler.kill()
        scheduler.wait()
