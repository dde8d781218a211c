"""GPU discovery against a fake NVML that behaves as NVML documents (a host's count includes the
GPUs a cgroup denies, whose handles raise NO_PERMISSION; MIG handles; UUIDs as bytes in older
bindings), and against the driver's folder with device files a cgroup denies."""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.trainlib._internal.common.fake_nvml import UNKNOWN, NVMLError, fake_nvml
from trainlib._internal.common import gpu_discovery


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
