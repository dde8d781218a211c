"""Processes on a host's GPUs that no rank of trainlib holds (a colleague's notebook, a process
left over from a crashed job, another framework's server), asked of NVML at each placement (run
on the worker; no torch import, no CUDA context).

A GPU with such a process is busy: a rank sharing it would run at a fraction of its speed or
run out of memory, and under the ``EXCLUSIVE_PROCESS`` compute mode it cannot open the GPU at
all (CUDA's "busy or unavailable"). ``TRAINLIB_GPU_OTHER_PROCESSES=ignore`` on the workers lets
ranks share GPUs with other processes (a host whose users agree to share). The MPS server is
never counted: sharing is what it is there for. The Dask worker's own CUDA context (dask-cuda
makes one) counts only under ``EXCLUSIVE_PROCESS``, where it keeps its own ranks out.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

OTHERS_VARIABLE = "TRAINLIB_GPU_OTHER_PROCESSES"  # "busy" (the default) or "ignore"
_SHARING_SERVICES = frozenset({"nvidia-cuda-mps-server"})
_MODES = {2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}  # NVML_COMPUTEMODE_*: 0 DEFAULT, 1 retired


class OthersSettingError(ValueError):
    """``TRAINLIB_GPU_OTHER_PROCESSES`` has a value it cannot have; the message says which."""


def other_users(uuids: Iterable[str]) -> dict[str, str]:
    """Of the devices ``uuids`` (GPUs or MIG devices), those in use by a process trainlib did not
    start or in a compute mode no rank may use, each with a sentence naming the process or the
    mode and what to do; none without NVML or with ``TRAINLIB_GPU_OTHER_PROCESSES=ignore``.

    Raises:
        OthersSettingError: ``TRAINLIB_GPU_OTHER_PROCESSES`` is neither ``busy`` nor ``ignore``.
    """
    setting = os.environ.get(OTHERS_VARIABLE, "busy").strip().lower() or "busy"
    if setting not in ("busy", "ignore"):
        raise OthersSettingError(
            f"{OTHERS_VARIABLE}={setting!r} on this worker; use 'busy' (a GPU another process "
            "uses is not given to a rank, the default) or 'ignore' (ranks share GPUs with them)."
        )
    nvml = _nvml() if setting == "busy" else None
    if nvml is None:
        return {}
    found = {}
    for uuid in uuids:
        why = _why_busy(nvml, uuid)
        if why:
            found[uuid] = why
    return found


@functools.cache
def _nvml() -> Any | None:
    """NVML, initialised once for this process's life (placement asks at every poll while it
    waits, and without persistence mode each ``nvmlInit`` sets up every GPU again); None
    without the library or the driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library or no driver: nothing to ask
        return None
    return pynvml


def _why_busy(nvml: Any, uuid: str) -> str | None:
    try:
        device = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except nvml.NVMLError:  # gone, or denied since discovery: placement says so otherwise
        return None
    mode = _compute_mode(nvml, device)
    if mode == "PROHIBITED":
        return (
            "no process: its compute mode is PROHIBITED (`nvidia-smi -q -d COMPUTE`); an "
            "administrator sets it back with `nvidia-smi -i <gpu> -c DEFAULT`"
        )
    exclusive = mode == "EXCLUSIVE_PROCESS"
    users = [
        (pid, name, memory)
        for pid, name, memory in _processes(nvml, device)
        if name not in _SHARING_SERVICES and (exclusive or pid != os.getpid())
    ]
    if not users:
        return None
    named = ", ".join(_process(pid, name, memory) for pid, name, memory in users)
    if exclusive:
        return (
            f"{named} in EXCLUSIVE_PROCESS compute mode, where one process at a time may use "
            "a GPU: stop it (a Dask worker must not touch CUDA itself), or have the GPU set to "
            "`nvidia-smi -c DEFAULT`"
        )
    return (
        f"{named}, not a rank of trainlib: stop it or give this run other GPUs (set "
        f"{OTHERS_VARIABLE}=ignore on the workers to share GPUs with other processes)"
    )


def _compute_mode(nvml: Any, device: Any) -> str | None:
    try:
        return _MODES.get(int(nvml.nvmlDeviceGetComputeMode(device)))
    except nvml.NVMLError:  # not supported (a MIG device answers for its GPU's mode)
        return None


def _processes(nvml: Any, device: Any) -> list[tuple[int, str, int | None]]:
    """The compute processes on ``device``: pid, name (empty where NVML may not read it: a pid
    of another namespace) and memory used in bytes (None where NVML does not say)."""
    try:
        running = nvml.nvmlDeviceGetComputeRunningProcesses(device)
    except nvml.NVMLError:  # not supported, or not permitted: nothing known
        return []
    found = []
    for process in running:
        try:
            name = nvml.nvmlSystemGetProcessName(process.pid)
        except nvml.NVMLError:
            name = ""
        name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        memory = getattr(process, "usedGpuMemory", None)
        found.append((int(process.pid), os.path.basename(name), memory))
    return found


def _process(pid: int, name: str, memory: int | None) -> str:
    details = [part for part in (name, _size(memory)) if part]
    return f"process {pid}" + (f" ({', '.join(details)})" if details else "")


def _size(memory: int | None) -> str:
    if not isinstance(memory, int) or memory < 0:
        return ""
    return f"{memory / 2**30:.1f} GiB" if memory >= 2**30 else f"{memory / 2**20:.0f} MiB"
