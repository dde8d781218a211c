"""The process group helpers: backend choice, rendezvous variables, init and destroy."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from tests.helpers import set_single_rank_environment
from trainlib import TorchConfig
from trainlib._internal.rank.backend import (
    choose_backend,
    destroy_process_group,
    find_free_port,
    init_process_group,
    is_collective_error,
    rank_environment,
)


@pytest.fixture
def one_rank_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment of rank 0 of a group of one, as its supervisor sets it."""
    set_single_rank_environment(monkeypatch)
    yield
    if dist.is_initialized():  # a failed test must not leave the group to the next one
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("backend", "use_gpu", "chosen"),
    [(None, True, "nccl"), (None, False, "gloo"), ("gloo", True, "gloo"), ("nccl", False, "nccl")],
)
def test_backend_choice_follows_gpus_unless_config_names_one(
    backend: str | None, use_gpu: bool, chosen: str
) -> None:
    assert choose_backend(TorchConfig(backend=backend), use_gpu) == chosen  # type: ignore[arg-type]


def test_backend_free_port_can_be_bound() -> None:
    port = find_free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", port))


def test_backend_rank_environment_is_torchrun_compatible() -> None:
    environment = rank_environment(
        world_rank=5,
        local_rank=1,
        node_rank=2,
        world_size=8,
        local_world_size=2,
        master_addr="10.0.0.1",
        master_port=29500,
    )
    assert environment == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "RANK": "5",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "2",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "2",
    }


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
