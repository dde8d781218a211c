"""What a rank is launched with: backend choice, rendezvous port and variables."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from trainlib import TorchConfig
from trainlib._internal.driver.run_plan import choose_backend, find_free_port, rank_environment


@pytest.mark.parametrize(
    ("backend", "use_gpu", "chosen"),
    [(None, True, "nccl"), (None, False, "gloo"), ("gloo", True, "gloo"), ("nccl", False, "nccl")],
)
def test_plan_backend_choice_follows_gpus_unless_config_names_one(
    backend: str | None, use_gpu: bool, chosen: str
) -> None:
    assert choose_backend(TorchConfig(backend=backend), use_gpu) == chosen  # type: ignore[arg-type]


def test_plan_free_port_is_one_the_kernel_hands_out_and_can_be_bound() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    port = find_free_port()
    assert low <= port <= high  # the kernel's pick (bind to port 0), not a fixed port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", port))
        s.listen()
        assert find_free_port() != port  # a port in use is never handed out


def test_plan_rank_environment_is_torchrun_compatible() -> None:
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
