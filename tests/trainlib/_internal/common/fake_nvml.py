"""A fake NVML (``pynvml``, as nvidia-ml-py exposes it) that behaves as NVML documents: a host's
count includes the GPUs a cgroup denies, whose handles raise NO_PERMISSION; a GPU in MIG mode
has MIG device handles; UUIDs and process names come back as bytes; a process name NVML may not
read raises NOT_FOUND; a MIG device has no compute mode of its own (NOT_SUPPORTED)."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from trainlib._internal.common import gpu_users

NO_PERMISSION, NOT_FOUND, NOT_SUPPORTED, UNKNOWN = 4, 6, 3, 999
DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS = 0, 2, 3  # NVML_COMPUTEMODE_*


class NVMLError(Exception):
    """As nvidia-ml-py's: the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


@dataclass
class ProcessInfo:
    """As nvmlDeviceGetComputeRunningProcesses' entries (``usedGpuMemory`` None where NVML
    does not know it)."""

    pid: int
    usedGpuMemory: int | None


def fake_nvml(
    gpus: list[dict[str, Any]],
    processes: dict[str, list[ProcessInfo]] | None = None,
    names: dict[int, str] | None = None,
) -> ModuleType:
    """An NVML whose host has ``gpus`` in PCI order, each {"uuid", "denied", "mig": [uuids],
    "mode": compute mode}: nvmlDeviceGetCount counts them all; a denied one's handle raises
    NO_PERMISSION (nvmlDeviceGetHandleByIndex's documented error for a device the caller may not
    use). ``processes``: the compute processes on each device (GPU or MIG UUID); ``names``: the
    name NVML reads for a pid (others raise NOT_FOUND)."""
    processes = processes or {}
    names = names or {}
    nvml = ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_ERROR_NO_PERMISSION = NO_PERMISSION  # type: ignore[attr-defined]
    nvml.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]

    def handle(index: int) -> dict[str, Any]:
        if gpus[index].get("denied"):
            raise NVMLError(NO_PERMISSION)
        return gpus[index]

    def by_uuid(uuid: str | bytes) -> dict[str, Any]:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in gpus:
            if gpu["uuid"] == uuid:
                if gpu.get("denied"):
                    raise NVMLError(NO_PERMISSION)
                return gpu
            if uuid in gpu.get("mig", ()):
                return {"uuid": uuid, "parent": gpu}
        raise NVMLError(NOT_FOUND)

    def mig_mode(gpu: dict[str, Any]) -> tuple[int, int]:
        if "mig" not in gpu:
            raise NVMLError(NOT_SUPPORTED)  # a GPU without MIG
        return (1, 1) if gpu["mig"] else (0, 0)

    def mig_handle(gpu: dict[str, Any], index: int) -> dict[str, Any]:
        if index >= len(gpu["mig"]):
            raise NVMLError(NOT_FOUND)  # an empty slot
        return {"uuid": gpu["mig"][index], "parent": gpu}

    def compute_mode(device: dict[str, Any]) -> int:
        if "parent" in device:
            raise NVMLError(NOT_SUPPORTED)
        return int(device.get("mode", DEFAULT))

    def process_name(pid: int) -> bytes:
        if pid not in names:
            raise NVMLError(NOT_FOUND)  # gone, or another pid namespace's
        return names[pid].encode()

    nvml.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUUID = lambda gpu: gpu["uuid"].encode()  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMigMode = mig_mode  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMaxMigDeviceCount = lambda gpu: 7  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeMode = compute_mode  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = (  # type: ignore[attr-defined]
        lambda device: list(processes.get(device["uuid"], []))
    )
    nvml.nvmlSystemGetProcessName = process_name  # type: ignore[attr-defined]
    return nvml


def install(monkeypatch: pytest.MonkeyPatch, nvml: ModuleType | None) -> None:
    """``nvml`` as ``pynvml`` for this test (None: the import fails), and ``gpu_users``'s NVML
    initialised afresh from it (its process-wide cache is the test's own until it ends)."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    fresh = functools.cache(gpu_users._nvml.__wrapped__)
    monkeypatch.setattr(gpu_users, "_nvml", fresh)
