"""The torch.distributed process group of a rank: init and destroy, and telling a peer's failure
from a root cause. (The backend, port and variables a rank is launched with:
``driver/run_plan.py``.)"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed

from trainlib._internal.common import device_holds, gpu_users
from trainlib._internal.common.devices import duplicate_devices, missing_kernels

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

_STORE_POLL_S = 0.005


def init_process_group(
    backend: Literal["gloo", "nccl"],
    timeout_s: int,
    use_gpu: bool,
    host: str = "",
    device_index: int = 0,
) -> None:
    """Join the group described by the environment; with GPUs, bind this rank's device (the
    ``device_index``-th it sees) first and fail at once, naming the ranks and the fix, if two
    ranks of one host were given the same device."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore
    from torch.distributed.rendezvous import rendezvous

    device = None
    if use_gpu:
        _hold_device(host)
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"ScalingConfig(use_gpu=True) but rank {os.environ['RANK']} on host "
                f"{host or socket.gethostname()} sees no CUDA device; check the Dask worker's "
                "CUDA_VISIBLE_DEVICES and its driver, or set use_gpu=False."
            )
        device = torch.device("cuda", device_index)
        unsupported = missing_kernels(
            torch.cuda.get_device_capability(device), torch.cuda.get_arch_list()
        )
        if unsupported:
            raise RuntimeError(
                f"Rank {os.environ['RANK']} on host {host or socket.gethostname()}: {unsupported}."
            )
        try:
            torch.cuda.set_device(device)  # makes the CUDA context
        except RuntimeError as error:
            raise _unavailable(error, host) from error
    if os.environ.get("RANK", "0") != "0":
        _wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_s)
    timeout = timedelta(seconds=timeout_s)
    # env:// as init_process_group does it, so the devices are compared before NCCL exists
    store, rank, world_size = next(rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    if device is not None:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        check_devices(store, rank, world_size, host or socket.gethostname(), uuid)
    dist.init_process_group(
        backend=backend,
        store=PrefixStore("default_pg", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,  # NCCL binds its communicator at once
    )


def _hold_device(host: str) -> None:
    """Hold this rank's GPU on its host until the rank ends (``device_holds``), before CUDA."""
    name = os.environ.get(device_holds.HOLD_VARIABLE)
    if not name:
        return
    try:
        device_holds.hold(name)
    except device_holds.DeviceBusy as busy:
        raise RuntimeError(
            f"Rank {os.environ.get('RANK', '0')} on host {host or socket.gethostname()}: {busy} "
            "(a run of another Dask scheduler on this host, or a process that kept it); wait "
            "for it to end, or give this run's workers other GPUs."
        ) from None


def _unavailable(error: RuntimeError, host: str) -> RuntimeError:
    """CUDA's "busy or unavailable" (the GPU's compute mode lets one process at a time use it,
    and another has it) as what it is and who has the GPU; any other error as it is."""
    if "busy or unavailable" not in str(error):
        return error
    name = os.environ.get(device_holds.HOLD_VARIABLE, "")
    who = gpu_users.other_users([name]).get(name) if name.startswith(("GPU-", "MIG-")) else None
    return RuntimeError(
        f"Rank {os.environ.get('RANK', '0')} on host {host or socket.gethostname()} cannot open "
        f"its GPU {name}: CUDA says it is busy or unavailable, which means its compute mode "
        "(EXCLUSIVE_PROCESS or PROHIBITED, see `nvidia-smi -q -d COMPUTE`) keeps this rank out "
        + (f"({who})." if who else "while another process uses it (`nvidia-smi` names it).")
    )


def _wait_for_store(host: str, port: int, timeout_s: float) -> None:
    """Wait until rank 0's TCPStore accepts connections (at most ``timeout_s``).

    torch's store client backs off 0.5-1.5 s after a refused connection, so a rank started a
    few milliseconds before rank 0 joined its group up to 0.65 s late (the start of every warm
    run). Any other error, or rank 0 never listening, is left to ``init_process_group`` to
    report as it does.
    """
    probe = retry(
        retry=retry_if_exception_type(ConnectionRefusedError),
        wait=wait_fixed(_STORE_POLL_S),
        stop=stop_after_delay(timeout_s),
        reraise=True,
    )(lambda: socket.create_connection((host, port), timeout=timeout_s).close())
    try:
        probe()
    except OSError:
        return


def check_devices(store: Store, rank: int, world_size: int, host: str, uuid: str) -> None:
    """Compare every rank's GPU (``uuid``, per host) through the rendezvous store, before any
    communicator exists: given the same device, NCCL fails inside ``init_process_group``
    ("Duplicate GPU detected") and names no fix."""
    from torch.distributed.distributed_c10d import PrefixStore

    devices = PrefixStore("trainlib/devices", store)
    devices.set(str(rank), f"{host}\n{uuid}")
    every = []
    for other in range(world_size):
        other_host, other_uuid = devices.get(str(other)).decode().split("\n")
        every.append((other, other_host, other_uuid))
    devices.set(f"read/{rank}", "")
    message = duplicate_devices(every)
    if message is not None:
        if rank == 0:  # the store lives in rank 0: keep it until every rank has read it
            devices.wait([f"read/{other}" for other in range(world_size)])
        raise RuntimeError(message)


def destroy_process_group() -> None:
    """Leave the process group together: all ranks meet at a barrier first.

    Without the barrier, a rank destroying its gloo group while a peer is still running
    aborted the process ("terminate called without an active exception") in about 1 run of 10
    here, with torch 2.14.1 under torchrun as well.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def is_collective_error(exc: BaseException) -> bool:
    """True for errors raised by a collective because a peer failed (not a root cause)."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    message = str(exc).lower()
    return "gloo" in message or "nccl" in message
