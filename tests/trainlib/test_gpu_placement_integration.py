"""GPU ranks on real devices: each binds its own GPU, sees its host's other ranks' GPUs (NCCL's
peer links), and a second run started meanwhile is given other GPUs. Skipped without the CUDA
devices each needs (none of the machines here has one); tests/trainlib/_internal/driver/ covers the
placement itself with the device discovery faked."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trainlib
from tests.helpers import local_cluster
from trainlib import DaskConfig, NotEnoughWorkersError, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer, get_device

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")


def _where(config: dict[str, Any]) -> None:
    import os

    import torch.distributed as dist

    device = get_device()
    total = torch.ones(1, device=device) * (trainlib.get_context().get_world_rank() + 1)
    dist.all_reduce(total)  # NCCL between the two GPUs
    mine = {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "index": device.index,
        "uuid": str(torch.cuda.get_device_properties(device).uuid),
        "sum": total.item(),
    }
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if "meet" in config:  # both runs hold their GPU at once: each waits for the other's mark
        meet = Path(config["meet"])
        (meet / trainlib.get_context().get_experiment_name()).touch()
        deadline = time.monotonic() + 60
        while len(list(meet.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    trainlib.report({"ranks": everyone})


def _gpu_trainer(
    loop: Any,
    config: dict[str, Any],
    storage: Path,
    address: str,
    num_workers: int = 1,
    name: str | None = None,
) -> TorchTrainer:
    """A GPU run of ``loop`` on the cluster at ``address``."""
    return TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=True),
        run_config=RunConfig(name=name, storage_path=str(storage)),
        dask_config=DaskConfig(address=address),
    )


def _address(client: Any) -> str:
    return str(client.scheduler.address)


@two_gpus
def test_gpu_ranks_of_a_host_see_each_others_devices_and_bind_their_own(tmp_path: Path) -> None:
    with local_cluster(2, processes=True) as client:
        result = _gpu_trainer(_where, {}, tmp_path, _address(client), num_workers=2).fit()
    first, second = result.metrics["ranks"]
    assert first["visible"] == second["visible"] and len(first["visible"].split(",")) == 2
    assert (first["index"], second["index"]) == (0, 1)
    assert first["uuid"] != second["uuid"]
    assert first["sum"] == second["sum"] == 3.0


@two_gpus
def test_gpu_a_run_started_while_another_holds_a_gpu_is_given_another(tmp_path: Path) -> None:
    with local_cluster(2, processes=True) as client:
        address = _address(client)
        results: dict[str, Any] = {}
        meet = tmp_path / "meet"
        meet.mkdir()

        def fit(name: str) -> None:
            loop = {"meet": str(meet)}
            results[name] = _gpu_trainer(_where, loop, tmp_path, address, name=name).fit()

        runs = [threading.Thread(target=fit, args=(name,)) for name in ("a", "b")]
        for run in runs:
            run.start()
        for run in runs:
            run.join()
    uuids = {name: result.metrics["ranks"][0]["uuid"] for name, result in results.items()}
    assert uuids["a"] != uuids["b"]


def _hold_until_released(config: dict[str, Any]) -> None:
    """A rank that holds its GPU until the test says so (a file), then reports."""
    Path(config["started"]).touch()
    deadline = time.monotonic() + 120
    while not Path(config["release"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    trainlib.report({"device": str(get_device())})


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_gpu_a_run_started_while_another_holds_the_only_gpu_is_told_which(tmp_path: Path) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    with local_cluster(2, processes=True) as client:
        address = _address(client)

        def trainer(name: str) -> TorchTrainer:
            loop = {"started": str(started), "release": str(release)}
            return _gpu_trainer(_hold_until_released, loop, tmp_path, address, name=name)

        first: dict[str, Any] = {}
        holder = threading.Thread(target=lambda: first.update(result=trainer("first").fit()))
        holder.start()
        try:
            deadline = time.monotonic() + 120
            while not started.exists():  # the first run's rank is on the GPU
                assert time.monotonic() < deadline and holder.is_alive(), (
                    "the first run never started"
                )
                time.sleep(0.05)
            with pytest.raises(NotEnoughWorkersError, match=r"GPU \S+ is used by run first"):
                trainer("second").fit()
        finally:
            release.touch()
            holder.join()
    assert first["result"].metrics["device"].startswith("cuda")


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_gpu_a_process_trainlib_did_not_start_keeps_its_gpu_and_is_named(tmp_path: Path) -> None:
    """A colleague's process with a CUDA context on every GPU of the host (NVML lists it; it
    holds no trainlib lock): a run is refused, naming the process."""
    code = (
        "import sys, torch\n"
        f"[torch.ones(1, device=f'cuda:{{i}}') for i in range({GPUS})]\n"
        "print('on', flush=True)\n"
        "sys.stdin.read()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"on\n"
        if not _nvml_lists_processes():
            pytest.skip("NVML lists no processes here (a container without the host's pids)")
        with local_cluster(1, processes=True) as client:
            trainer = _gpu_trainer(_cuda_in_rank, {}, tmp_path, _address(client), name="late")
            with pytest.raises(NotEnoughWorkersError, match=r"is used by process \d+"):
                trainer.fit()
    finally:
        other.kill()
        other.wait()


def _nvml_lists_processes() -> bool:
    """Whether NVML lists the compute processes of GPU 0 here (a container with a pid namespace
    of its own sees none on many drivers: docs/scaling.md)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        return bool(pynvml.nvmlDeviceGetComputeRunningProcesses(device))
    finally:
        pynvml.nvmlShutdown()


def _cuda_in_rank(config: dict[str, Any]) -> None:
    torch.ones(1, device=get_device())  # the rank's CUDA context
    trainlib.report({"initialized": torch.cuda.is_initialized(), "pid": os.getpid()})


def _fork_servers_with_cuda(dask_worker: Any) -> dict[int, bool]:
    """Each fork server of this worker: whether the CUDA driver is mapped into it."""
    from trainlib._internal.worker.process_globals import WORKER

    servers = WORKER.fork_servers.get(dask_worker.address, [])
    return {
        s.process.pid: "libcuda.so" in Path(f"/proc/{s.process.pid}/maps").read_text()
        for s in servers
    }


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_gpu_the_fork_server_never_initialises_cuda_its_forked_rank_does(tmp_path: Path) -> None:
    """A forked child of a process with a CUDA context cannot use CUDA: the server must never
    make one, whatever its ranks did."""
    with local_cluster(1, processes=True) as client:
        for _ in range(2):  # the second rank forked after the first used CUDA
            result = _gpu_trainer(_cuda_in_rank, {}, tmp_path, _address(client)).fit()
            assert result.metrics["initialized"] is True
        servers = client.run(_fork_servers_with_cuda)
    found = [used for by_server in servers.values() for used in by_server.values()]
    assert found and not any(found)
