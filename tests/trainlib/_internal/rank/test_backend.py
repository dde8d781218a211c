"""The rank's process group: init and destroy, collective errors."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

from tests.helpers import set_single_rank_environment
from tests.trainlib._internal.common.fake_nvml import (
    EXCLUSIVE_PROCESS,
    ProcessInfo,
    fake_nvml,
    install,
)
from trainlib._internal.common import device_holds
from trainlib._internal.rank import backend
from trainlib._internal.rank.backend import (
    check_devices,
    destroy_process_group,
    init_process_group,
    is_collective_error,
)


@pytest.fixture
def one_rank_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment of rank 0 of a group of one, as its supervisor sets it."""
    set_single_rank_environment(monkeypatch)
    yield
    if dist.is_initialized():  # a failed test must not leave the group to the next one
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_environment")
def test_backend_init_joins_the_group_of_the_environment_and_destroy_leaves_it() -> None:
    init_process_group("gloo", timeout_s=30, use_gpu=False)
    assert dist.is_initialized()
    assert (dist.get_backend(), dist.get_rank(), dist.get_world_size()) == ("gloo", 0, 1)
    destroy_process_group()
    assert not dist.is_initialized()


def test_backend_destroy_without_a_group_does_nothing() -> None:
    assert not dist.is_initialized()
    destroy_process_group()
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA devices")
@pytest.mark.usefixtures("one_rank_environment")
def test_backend_init_with_gpu_but_no_cuda_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match=r"rank 0 on host .* sees no CUDA device; check"):
        init_process_group("nccl", timeout_s=30, use_gpu=True)
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "exc",
    [
        dist.DistNetworkError("Connection closed by peer"),
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset"),
        RuntimeError("NCCL communicator was aborted on rank 1"),
    ],
)
def test_backend_collective_errors_are_recognised(exc: BaseException) -> None:
    assert is_collective_error(exc)


def test_backend_user_errors_are_not_collective_errors() -> None:
    assert not is_collective_error(ValueError("shapes (3, 4) and (5, 6) do not match"))
    assert not is_collective_error(KeyboardInterrupt())


def test_wait_for_store_returns_once_rank_zeros_port_listens_and_gives_up_quietly() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        backend._wait_for_store("127.0.0.1", port, timeout_s=30)  # returns: it listens
        assert listening.accept()[0] is not None  # and the probe really connected
    started = time.monotonic()
    backend._wait_for_store("127.0.0.1", port, timeout_s=0.2)  # nobody listens any more
    assert time.monotonic() - started >= 0.2  # it kept trying for the whole timeout
    # what is not a refusal is left to init_process_group at once (here: a bad address)
    backend._wait_for_store("256.0.0.1", port, timeout_s=30)


def _check_devices_of(hosts_and_uuids: list[tuple[str, str]]) -> list[str | None]:
    """Each rank's outcome of ``check_devices`` (None, or its error), ranks as threads sharing
    one real TCPStore as the ranks of a group do."""
    world_size = len(hosts_and_uuids)
    master = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    stores = [master] + [
        dist.TCPStore("127.0.0.1", master.port, world_size, is_master=False)
        for _ in range(world_size - 1)
    ]

    def rank(index: int) -> str | None:
        host, uuid = hosts_and_uuids[index]
        try:
            check_devices(stores[index], index, world_size, host, uuid)
        except RuntimeError as exc:
            return str(exc)
        return None

    with ThreadPoolExecutor(world_size) as pool:
        return list(pool.map(rank, range(world_size)))


def test_backend_check_devices_passes_when_each_rank_of_a_host_has_its_own_gpu() -> None:
    outcomes = _check_devices_of([("h1", "GPU-a"), ("h1", "GPU-b"), ("h2", "GPU-a")])
    assert outcomes == [None, None, None]


def test_backend_check_devices_fails_every_rank_naming_the_shared_gpu_and_the_fix() -> None:
    outcomes = _check_devices_of([("h1", "GPU-a"), ("h2", "GPU-a"), ("h2", "GPU-a")])
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert outcomes[0] is not None
    assert outcomes[0].startswith("ranks 1, 2 on host h2 were all given GPU GPU-a;")
    assert "CUDA_VISIBLE_DEVICES" in outcomes[0]


def test_cudas_busy_or_unavailable_is_told_as_the_compute_mode_and_the_process_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA's words when another process has a GPU in EXCLUSIVE_PROCESS mode (cudaSetDevice makes
    the context), as torch raises them; NVML (faked as documented) names the process."""
    gpus = [{"uuid": "GPU-a", "mode": EXCLUSIVE_PROCESS}]
    nvml = fake_nvml(gpus, {"GPU-a": [ProcessInfo(808, 2**30)]}, {808: "/usr/bin/python3"})
    install(monkeypatch, nvml)
    monkeypatch.setenv(device_holds.HOLD_VARIABLE, "GPU-a")
    monkeypatch.setenv("RANK", "2")
    cuda = RuntimeError(
        "CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
        "CUDA kernel errors might be asynchronously reported at some other API call"
    )
    message = str(backend._unavailable(cuda, "n1"))
    assert message.startswith(
        "Rank 2 on host n1 cannot open its GPU GPU-a: CUDA says it is busy or unavailable"
    )
    assert "process 808 (python3, 1.0 GiB) in EXCLUSIVE_PROCESS compute mode" in message
    other = RuntimeError("CUDA error: out of memory")
    assert backend._unavailable(other, "n1") is other  # any other error as it is
    install(monkeypatch, None)  # without NVML: still what it means
    assert "`nvidia-smi` names it" in str(backend._unavailable(cuda, "n1"))
