from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from trainlib._internal.common.messages import RankLaunch
from trainlib._internal.driver.run_plan import rank_environment as rank_torch_environment
from trainlib._internal.worker.rank_pool import process_environment
from trainlib._internal.worker.supervisor import exit_failure, launch_environment, thread_share


def _launch(**changes: object) -> RankLaunch:
    launch = RankLaunch(
        world_rank=1,
        host="127.0.0.1",
        local_rank=1,
        local_world_size=2,
        use_gpu=False,
        torch_environment=rank_torch_environment(
            world_rank=1,
            local_rank=1,
            node_rank=0,
            world_size=2,
            local_world_size=2,
            master_addr="127.0.0.1",
            master_port=29555,
        ),
        sys_path=(),
        spec_payload=b"",
    )
    return replace(launch, **changes)  # type: ignore[arg-type]


def test_supervisor_drops_the_nanny_environment() -> None:
    nanny_env = {"MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", "PATH": "/bin"}
    env = process_environment(nanny_env)
    assert "MALLOC_TRIM_THRESHOLD_" not in env and "OMP_NUM_THREADS" not in env
    assert env["PATH"] == "/bin"


def test_supervisor_launch_sets_torchrun_variables_and_a_thread_count() -> None:
    env = launch_environment(_launch(), {"PATH": "/bin"})
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == (
        "1",
        "1",
        "2",
        "29555",
    )
    assert int(env["OMP_NUM_THREADS"]) >= 1


def test_supervisor_thread_share_divides_the_cores_between_a_hosts_ranks() -> None:
    assert thread_share(16, 2) == 8
    assert thread_share(16, 3) == 5
    assert thread_share(2, 4) == 1  # never zero threads
    assert thread_share(None, 1) == 1  # os.cpu_count() may not know


def test_supervisor_thread_share_of_a_worker_pinned_to_its_own_cores_is_those_cores() -> None:
    """dask-cuda pins each of a host's four workers to its GPU's 4 of 16 cores: each rank
    gets those 4, not 4 divided by the host's 4 ranks."""
    assert thread_share(4, 4, pinned=True) == 4
    assert thread_share(16, 4, pinned=False) == 4


_PINNED = """
import os, sys
from trainlib._internal.common.devices import pinned_to_own_cores
before = pinned_to_own_cores()
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: fewer than its parent's
print(before, pinned_to_own_cores())
"""


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_supervisor_a_process_on_fewer_cores_than_its_parent_is_pinned() -> None:
    assert len(os.sched_getaffinity(0)) >= 2, "needs two cores to pin to fewer"
    done = subprocess.run([sys.executable, "-c", _PINNED], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_supervisor_keeps_thread_settings_the_user_chose() -> None:
    chosen = {"OMP_NUM_THREADS": "3", "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    env = launch_environment(_launch(), chosen)
    assert "OMP_NUM_THREADS" not in env and "TORCHINDUCTOR_COMPILE_THREADS" not in env


def test_supervisor_gives_a_gpu_rank_the_devices_the_driver_chose() -> None:
    inherited = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    launch = _launch(use_gpu=True, visible_devices=("2", "0"), device_hold="GPU-cccc2222")
    env = launch_environment(launch, inherited)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,0"  # its own and its host's other rank's
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # numbered as the placement read them
    assert env["TRAINLIB_GPU_HOLD"] == "GPU-cccc2222"  # held on its host while it lives


def test_supervisor_keeps_the_device_order_the_user_chose() -> None:
    """A worker whose environment sets CUDA_DEVICE_ORDER keeps it in its ranks (they inherit
    it); only where it is unset do ranks number devices in PCI bus order."""
    launch = _launch(use_gpu=True, visible_devices=("GPU-aaaa", "GPU-bbbb"))
    chosen = launch_environment(launch, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert "CUDA_DEVICE_ORDER" not in chosen  # the inherited FASTEST_FIRST stands
    assert launch_environment(launch, {})["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_supervisor_shares_the_cores_of_the_cpuset_not_of_the_host() -> None:
    # a worker restricted to one core (a SLURM job's or a container's cpuset) on a host with
    # more: each rank's OpenMP and Inductor compile threads come from that one core
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from tests.trainlib._internal.worker.test_supervisor import _launch; "
        "from trainlib._internal.worker.supervisor import launch_environment; "
        "env = launch_environment(_launch(local_world_size=1), {}); "
        "print(env['OMP_NUM_THREADS'], env['TORCHINDUCTOR_COMPILE_THREADS'], os.cpu_count())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    threads, compile_threads, host_cores = done.stdout.split()
    assert (threads, compile_threads) == ("1", "1")
    assert int(host_cores) >= 1


def test_supervisor_leaves_cpu_ranks_devices_alone() -> None:
    env = launch_environment(_launch(), {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_supervisor_names_nccls_watchdog_in_a_gpu_ranks_abort() -> None:
    aborted = exit_failure(_launch(use_gpu=True), -signal.SIGABRT)
    assert aborted.is_collective_error  # a peer's failure is the root cause where there is one
    assert "NCCL's watchdog" in aborted.summary and "TorchConfig(timeout_s)" in aborted.summary
    cpu = exit_failure(_launch(), -signal.SIGABRT)
    assert (cpu.summary, cpu.is_collective_error) == (
        "rank process was killed by signal SIGABRT",
        False,
    )


def test_supervisor_gives_a_rank_its_clusters_scheduler_if_another_process_can_reach_it() -> None:
    tcp = launch_environment(_launch(), {}, "tcp://10.0.0.5:8786")
    assert tcp["DASK_SCHEDULER_ADDRESS"] == "tcp://10.0.0.5:8786"
    assert "DASK_SCHEDULER_ADDRESS" not in launch_environment(_launch(), {}, "inproc://h/1/2")
    own = {"DASK_SCHEDULER_ADDRESS": "tcp://other:8786"}  # the user's choice is kept
    assert "DASK_SCHEDULER_ADDRESS" not in launch_environment(_launch(), own, "tcp://s:1")
