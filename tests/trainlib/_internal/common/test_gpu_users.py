"""Other processes on a host's GPUs, asked of a fake NVML that behaves as NVML documents, on
generated hosts: every mix of compute modes, foreign processes, the worker's own context, the
MPS server, names NVML may not read and memory it does not know, compared with what the
module's docstring promises."""

from __future__ import annotations

import os
import random

import pytest

from tests.trainlib._internal.common.fake_nvml import (
    DEFAULT,
    EXCLUSIVE_PROCESS,
    PROHIBITED,
    ProcessInfo,
    fake_nvml,
    install,
)
from trainlib._internal.common import gpu_users

MPS = "nvidia-cuda-mps-server"


def _host(seed: int) -> tuple[list[dict], dict[str, list[ProcessInfo]], dict[int, str]]:
    """A random host: GPUs (some in MIG mode), each device's processes, their readable names."""
    rng = random.Random(seed)
    gpus, processes, names = [], {}, {}
    pids = iter(rng.sample(range(1000, 90000), 200))
    for index in range(rng.randint(1, 5)):
        gpu = {"uuid": f"GPU-{seed}-{index}", "mode": rng.choice([DEFAULT, PROHIBITED, 3, 3])}
        if rng.random() < 0.3:
            gpu["mig"] = [f"MIG-{seed}-{index}-{s}" for s in range(rng.randint(1, 3))]
        gpus.append(gpu)
        for device in gpu.get("mig", [gpu["uuid"]]):
            found = []
            for _ in range(rng.choice([0, 0, 1, 2, 3])):
                kind = rng.choice(["foreign", "own", "mps", "unnamed"])
                pid = os.getpid() if kind == "own" else next(pids)
                if kind in ("foreign", "own"):
                    names[pid] = rng.choice(["/usr/bin/python3", "jupyter", "x"])
                if kind == "mps":
                    names[pid] = f"/usr/bin/{MPS}"
                memory = rng.choice([None, 0, 5 * 2**20, 3 * 2**30])
                found.append(ProcessInfo(pid, memory))
            processes[device] = found
    return gpus, processes, names


def _expected(gpus: list[dict], processes: dict, names: dict[int, str]) -> dict[str, set[int]]:
    """The docstring's rule: each device that is busy, with the pids that make it so."""
    busy = {}
    for gpu in gpus:
        mode = gpu.get("mode", DEFAULT)
        for device in gpu.get("mig", [gpu["uuid"]]):
            exclusive = mode == EXCLUSIVE_PROCESS and "mig" not in gpu  # MIG: no mode of its own
            users = {
                p.pid
                for p in processes[device]
                if os.path.basename(names.get(p.pid, "")) != MPS
                and (exclusive or p.pid != os.getpid())
            }
            if mode == PROHIBITED and "mig" not in gpu:
                busy[device] = set()
            elif users:
                busy[device] = users
    return busy


@pytest.mark.parametrize("seed", range(300))
def test_a_device_is_busy_exactly_when_another_process_or_its_mode_keeps_a_rank_out(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    gpus, processes, names = _host(seed)
    install(monkeypatch, fake_nvml(gpus, processes, names))
    devices = [d for gpu in gpus for d in gpu.get("mig", [gpu["uuid"]])]
    found = gpu_users.other_users(devices)
    expected = _expected(gpus, processes, names)
    assert set(found) == set(expected)
    for device, why in found.items():
        for pid in expected[device]:
            assert f"process {pid}" in why  # every process that makes it busy is named
        if not expected[device]:
            assert "PROHIBITED" in why and "nvidia-smi" in why
        elif "EXCLUSIVE_PROCESS" in why:
            assert "one process at a time" in why
        else:
            assert "TRAINLIB_GPU_OTHER_PROCESSES=ignore" in why
    monkeypatch.setenv("TRAINLIB_GPU_OTHER_PROCESSES", "ignore")
    assert gpu_users.other_users(devices) == {}


def test_the_message_names_the_process_its_program_and_its_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]
    processes = {"GPU-a": [ProcessInfo(4242, 3 * 2**30)], "GPU-b": [ProcessInfo(77, None)]}
    install(monkeypatch, fake_nvml(gpus, processes, {4242: "/opt/x/jupyter"}))
    found = gpu_users.other_users(["GPU-a", "GPU-b", "GPU-gone"])
    assert found["GPU-a"].startswith("process 4242 (jupyter, 3.0 GiB), not a rank of trainlib")
    assert found["GPU-b"].startswith("process 77, not a rank of trainlib")  # nothing more known
    assert set(found) == {"GPU-a", "GPU-b"}  # a device NVML no longer knows is not busy


@pytest.mark.parametrize("value", ["no", "Busy ", "0", "ignore-all"])
def test_a_setting_it_cannot_have_is_refused_naming_both_values(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    install(monkeypatch, fake_nvml([{"uuid": "GPU-a"}]))
    monkeypatch.setenv("TRAINLIB_GPU_OTHER_PROCESSES", value)
    if value.strip().lower() == "busy":
        assert gpu_users.other_users(["GPU-a"]) == {}
        return
    with pytest.raises(gpu_users.OthersSettingError, match=r"'busy'.*'ignore'"):
        gpu_users.other_users(["GPU-a"])


def test_without_nvml_nothing_is_known_and_nothing_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None)  # import fails
    assert gpu_users.other_users(["GPU-a"]) == {}
