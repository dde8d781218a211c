"""GPU discovery against a fake NVML that behaves as NVML documents (a host's count includes the
GPUs a cgroup denies, whose handles raise NO_PERMISSION; MIG handles; UUIDs as bytes in older
bindings), and against the driver's folder with device files a cgroup denies."""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trainlib._internal.common import gpu_discovery

NO_PERMISSION, NOT_FOUND, NOT_SUPPORTED, UNKNOWN = 4, 6, 3, 999


class NVMLError(Exception):
    """As nvidia-ml-py's: the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_nvml(gpus: list[dict[str, Any]]) -> ModuleType:
    """An NVML whose host has ``gpus`` in PCI order, each {"uuid", "denied", "mig": [uuids]}:
    nvmlDeviceGetCount counts them all; a denied one's handle raises NO_PERMISSION
    (nvmlDeviceGetHandleByIndex's documented error for a device the caller may not use)."""
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

    def mig_mode(gpu: dict[str, Any]) -> tuple[int, int]:
        if "mig" not in gpu:
            raise NVMLError(NOT_SUPPORTED)  # a GPU without MIG
        return (1, 1) if gpu["mig"] else (0, 0)

    def mig_handle(gpu: dict[str, Any], index: int) -> dict[str, Any]:
        if index >= len(gpu["mig"]):
            raise NVMLError(NOT_FOUND)  # an empty slot
        return {"uuid": gpu["mig"][index]}

    nvml.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUUID = lambda gpu: gpu["uuid"].encode()  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMigMode = mig_mode  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMaxMigDeviceCount = lambda gpu: 7  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    return nvml


def _discovered(monkeypatch: pytest.MonkeyPatch, gpus: list[dict[str, Any]]) -> Any:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus))
    gpu_discovery._nvml_scan.cache_clear()
    try:
        return gpu_discovery.nvml_devices()
    finally:
        gpu_discovery._nvml_scan.cache_clear()


def test_a_jobs_cgroup_leaves_out_the_gpus_it_denies(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SLURM job given GPUs 2 and 3 of four (ConstrainDevices): CUDA numbers them 0 and 1,
    and so does discovery; never the host's GPUs 0 and 1."""
    host = [{"uuid": f"GPU-{i}"} for i in range(4)]
    job = [{**gpu, "denied": i < 2} for i, gpu in enumerate(host)]
    assert _discovered(monkeypatch, job) == ("GPU-2", "GPU-3")
    scattered = [{**gpu, "denied": i % 2 == 0} for i, gpu in enumerate(host)]
    assert _discovered(monkeypatch, scattered) == ("GPU-1", "GPU-3")
    assert _discovered(monkeypatch, host) == ("GPU-0", "GPU-1", "GPU-2", "GPU-3")


def test_mig_devices_stand_for_their_gpu_and_denied_gpus_count_for_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = [
        {"uuid": "GPU-0", "denied": True, "mig": ["MIG-a"]},
        {"uuid": "GPU-1", "mig": ["MIG-b", "MIG-c"]},
        {"uuid": "GPU-2", "mig": []},  # MIG-capable, not in MIG mode
    ]
    assert _discovered(monkeypatch, gpus) == ("MIG-b", "MIG-c", "GPU-2")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus))
    gpu_discovery._nvml_scan.cache_clear()
    try:
        assert gpu_discovery.mig_parents() == (("MIG-b", "GPU-1"), ("MIG-c", "GPU-1"))
    finally:
        gpu_discovery._nvml_scan.cache_clear()


def test_another_nvml_error_is_not_taken_for_a_denied_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only NO_PERMISSION leaves a GPU out: on any other error NVML's list is not trusted."""
    nvml = fake_nvml([{"uuid": "GPU-0"}])

    def lost(index: int) -> Any:
        raise NVMLError(UNKNOWN)

    nvml.nvmlDeviceGetHandleByIndex = lost  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu_discovery._nvml_scan.cache_clear()
    try:
        assert gpu_discovery.nvml_devices() is None
    finally:
        gpu_discovery._nvml_scan.cache_clear()


def test_the_driver_folder_leaves_out_gpus_whose_device_file_is_denied(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cgroup's denial: opening the device file fails with EPERM (root included)."""
    denied = str(tmp_path / "nvidia0")
    real_open = os.open

    def cgroup_open(path: str, flags: int, *args: Any) -> int:
        if path == denied:
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(gpu_discovery.os, "open", cgroup_open)
    _driver_folder_with_denied_gpu(monkeypatch, tmp_path, deny=lambda file: None)
    assert gpu_discovery.driver_devices() == (1, ("GPU-bbbb",))


def test_the_driver_folder_leaves_out_gpus_without_a_device_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A container or job given one of two GPUs has only that one's device file."""
    _driver_folder_with_denied_gpu(monkeypatch, tmp_path, deny=Path.unlink)
    assert gpu_discovery.driver_devices() == (1, ("GPU-bbbb",))


def _driver_folder_with_denied_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, deny: Any
) -> None:
    """Two GPUs in the driver's folder, minors 0 and 1, the first's device file denied."""
    for minor, (bus, uuid) in enumerate(
        (("0000:01:00.0", "GPU-aaaa"), ("0000:41:00.0", "GPU-bbbb"))
    ):
        (tmp_path / "gpus" / bus).mkdir(parents=True)
        (tmp_path / "gpus" / bus / "information").write_text(
            f"Model: X\nIRQ: 1\nGPU UUID: {uuid}\nDevice Minor: {minor}\n"
        )
        (tmp_path / f"nvidia{minor}").write_text("")
        (tmp_path / f"nvidia{minor}").chmod(stat.S_IRUSR | stat.S_IWUSR)
    deny(tmp_path / "nvidia0")
    monkeypatch.setattr(gpu_discovery, "_NVIDIA_GPUS_DIR", str(tmp_path / "gpus"))
    monkeypatch.setattr(gpu_discovery, "_DEVICE_FILE", str(tmp_path / "nvidia{minor}"))
