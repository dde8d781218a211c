"""What GPUs a Dask worker's host lets it use, named by physical identity (run on the worker;
no torch import, no CUDA context).

NVML (``nvidia-ml-py``) first: the GPUs this process may open (a SLURM job's cgroup, a container's
devices), in PCI bus order, which is how ranks number them (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, set
by the supervisor where the worker leaves it unset); a GPU in MIG mode counts as its MIG devices.
Without NVML (no driver library, WSL2's partial one), the driver's ``/proc`` list: its folders are
PCI bus ids and each ``information`` file names the GPU's UUID. Each device is a UUID (``GPU-...``
or ``MIG-...``): every way of naming one device (an index, a UUID or its prefix, a SLURM-renumbered
index, a rotated list) comes back to it (``devices.device_key``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from trainlib._internal.common import device_holds, gpu_users
from trainlib._internal.common.devices import parse_visible

_NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"  # one folder per GPU the driver manages
_DEVICE_FILE = "/dev/nvidia{minor}"  # a GPU's device file, by its minor number

Probe = tuple[
    tuple[str, ...] | None,
    int,
    tuple[str, ...] | None,
    tuple[str, ...] | None,
    tuple[tuple[str, str], ...],
    tuple[tuple[str, str], ...],
    tuple[tuple[str, str], ...],
]


def probe_worker_devices() -> Probe:
    """This process's CUDA_VISIBLE_DEVICES, its host's device count, its SLURM job's GPUs, the
    devices' UUIDs in CUDA's PCI-bus numbering (None where they cannot be read), which
    devices a rank on the host holds now, with who (``device_holds``), each MIG device's GPU
    (``mig_parents``), and the devices other processes use now, with why (``gpu_users``)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = None if value is None else parse_visible(value)
    job_value = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS")
    job = None if job_value is None else parse_visible(job_value)
    nvml = nvml_devices()
    count, uuids = (len(nvml), nvml) if nvml is not None else driver_devices()
    names = uuids or job or tuple(str(i) for i in range(count))
    holders = device_holds.holders(names) if count else {}
    held = tuple(sorted(holders.items()))
    others = {k: v for k, v in gpu_users.other_users(nvml or ()).items() if k not in holders}
    return visible, count, job, uuids, held, mig_parents(), tuple(sorted(others.items()))


def nvml_devices() -> tuple[str, ...] | None:
    """The UUIDs of the devices NVML lets this process see, MIG devices for a GPU in MIG mode;
    None without NVML."""
    scan = _nvml_scan()
    return None if scan is None else tuple(uuid for uuid, _ in scan)


def mig_parents() -> tuple[tuple[str, str], ...]:
    """Each MIG device this process may see, with its GPU's UUID (NCCL refuses two ranks of
    one group on slices of one GPU)."""
    return tuple((uuid, gpu) for uuid, gpu in _nvml_scan() or () if gpu is not None)


@functools.cache
def _nvml_scan() -> tuple[tuple[str, str | None], ...] | None:
    """The devices NVML lets this process see, as (UUID, its GPU's UUID for a MIG device);
    None without NVML. Read once per process: placement probes a worker at every poll while it
    waits, and a host's devices do not change under a running worker (MIG is reconfigured only
    with no process on the GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library or no driver: NVML is not there
        return None
    try:
        found: list[tuple[str, str | None]] = []
        for index in range(pynvml.nvmlDeviceGetCount()):  # every GPU of the host, in PCI order
            try:
                gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as error:
                if getattr(error, "value", None) == pynvml.NVML_ERROR_NO_PERMISSION:
                    continue  # denied to this process (a cgroup): CUDA does not number it either
                raise
            uuid = _text(pynvml.nvmlDeviceGetUUID(gpu))
            found += [(mig, uuid) for mig in _mig_devices(pynvml, gpu)] or [(uuid, None)]
        return tuple(found)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _mig_devices(nvml: Any, gpu: Any) -> list[str]:
    """The MIG devices of a GPU in MIG mode (none otherwise)."""
    try:
        current, _ = nvml.nvmlDeviceGetMigMode(gpu)
    except nvml.NVMLError:  # no MIG on this GPU
        return []
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
        except nvml.NVMLError:  # an empty slot
            continue
        found.append(_text(nvml.nvmlDeviceGetUUID(mig)))
    return found


def driver_devices() -> tuple[int, tuple[str, ...] | None]:
    """The driver's GPUs this process may open, in PCI bus order: how many, and their UUIDs
    where every one's is read. The driver lists every GPU of the host; one whose device file
    (``/dev/nvidia<minor>``, its ``Device Minor``) this process may not open (a SLURM job's
    cgroup, a container given other GPUs) is left out, as CUDA leaves it out of its numbering."""
    try:
        folders = sorted(Path(_NVIDIA_GPUS_DIR).iterdir())
    except OSError:
        return 0, None
    uuids: list[str] | None = []
    count = 0
    for folder in folders:
        try:
            lines = (folder / "information").read_text().splitlines()
        except OSError:
            lines = []
        fields = dict(
            (key.strip(), value.strip())
            for key, _, value in (line.partition(":") for line in lines)
        )
        minor = fields.get("Device Minor")
        if minor is not None and not _may_open(_DEVICE_FILE.format(minor=minor)):
            continue
        count += 1
        uuid = fields.get("GPU UUID")
        uuids = [*uuids, uuid] if uuids is not None and uuid else None
    return count, tuple(uuids) if uuids else None


def _may_open(device_file: str) -> bool:
    """Whether this process may open a GPU's device file (the cgroup's verdict: opening it
    creates no CUDA context)."""
    try:
        os.close(os.open(device_file, os.O_RDONLY))
    except (PermissionError, FileNotFoundError):
        return False
    except OSError:  # another error: the file is there and not denied
        return True
    return True


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
