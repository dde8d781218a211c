"""The faults a night may get, each injected at one phase of the nightly and recovered the way
production recovers it (a supervisor restarts what died; an outage ends). ``rides_through``:
the product promises the night completes anyway; otherwise it may fail, and must be alerted.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.helpers import rank_processes
from tests.soak.rig import Rig

PHASES = ("download", "preprocess", "train", "register", "evaluate", "promote")
ALL = PHASES
DURING_DATA = ("preprocess", "train")


class NotInjected(Exception):
    """The fault found nothing to strike (no rank running, a disk it could not fill): the night
    proves nothing about it and is run again."""


@dataclass(frozen=True)
class Fault:
    """A fault: where it may strike, whether the night must ride through it, how to inject it
    (blocking until it is over; returns what was done)."""

    name: str
    phases: tuple[str, ...]
    rides_through: bool
    inject: Callable[[Rig, random.Random], str]
    needs_root: bool = False


def _worker_tree_killed(rig: Rig, rng: random.Random) -> str:
    killed = rig.kill_worker_tree()
    rig.start_worker()  # its supervisor (the container's restart policy) starts it again
    return f"SIGKILLed the Prefect worker's tree ({killed} processes); worker restarted"


def _rank_killed(rig: Rig, rng: random.Random) -> str:
    deadline = time.monotonic() + 20
    while not (ranks := rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not ranks:
        raise NotInjected("no rank process was running: nothing killed")
    victim = rng.choice(sorted(ranks, key=lambda p: p.pid))
    victim.kill()
    return f"SIGKILLed rank process {victim.pid}"


def _dask_worker_killed(rig: Rig, rng: random.Random) -> str:
    victim = rng.choice(rig.dask.worker_processes())
    victim.kill()  # its nanny starts a new one
    return f"SIGKILLed Dask worker process {victim.pid} (its nanny restarts it)"


def _outage(stop: Callable[[], None], start: Callable[[], None], seconds: float) -> None:
    stop()
    time.sleep(seconds)
    start()


def _s3_down(rig: Rig, rng: random.Random) -> str:
    seconds = rng.uniform(20, 120)
    _outage(rig.s3.stop, rig.s3.start, seconds)
    return f"S3 down {seconds:.0f} s"


def _postgres_restarted(rig: Rig, rng: random.Random) -> str:
    rig.postgres.restart()
    return "PostgreSQL restarted (fast shutdown: every connection cut)"


def _mlflow_down(rig: Rig, rng: random.Random) -> str:
    seconds = rng.uniform(60, 180)
    _outage(rig.mlflow.stop, rig.mlflow.start, seconds)
    return f"MLflow down {seconds:.0f} s"


def _registry_reply_lost(rig: Rig, rng: random.Random) -> str:
    rig.proxy.arm()
    return "the reply to the next model-version create is lost"


def _prefect_down(rig: Rig, rng: random.Random) -> str:
    seconds = rng.uniform(60, 120)
    _outage(rig.prefect.stop, rig.prefect.start, seconds)
    return f"Prefect server down {seconds:.0f} s"


def _disk_full(rig: Rig, rng: random.Random) -> str:
    """S3's disk (a small tmpfs the rig mounted for SeaweedFS's data) filled to the last byte."""
    data = rig.s3.root / "data"
    free = os.statvfs(data)
    ballast = data / "ballast"
    seconds = rng.uniform(20, 60)
    filled = subprocess.run(
        ["fallocate", "-l", str(free.f_bavail * free.f_frsize), str(ballast)],
        capture_output=True,
        text=True,
        check=False,
    )
    if filled.returncode != 0:
        ballast.unlink(missing_ok=True)
        raise NotInjected(f"fallocate could not fill S3's disk: {filled.stderr.strip()}")
    try:
        time.sleep(seconds)
    finally:
        ballast.unlink(missing_ok=True)
    return f"S3's disk full for {seconds:.0f} s"


def _network_cut(rig: Rig, rng: random.Random) -> str:
    """A host cut off: every process of one Dask worker's host stopped (SIGSTOP), then resumed:
    what its peers see of a host whose network is cut (this kernel has no netem)."""
    index = rng.randrange(len(rig.dask.nannies))
    seconds = rng.uniform(20, 60)
    tree = rig.dask.host_tree(index)
    if not tree:
        raise NotInjected(f"Dask host w{index + 1} had no process to stop")
    for process in tree:
        _signal(process, signal.SIGSTOP)
    time.sleep(seconds)
    for process in rig.dask.host_tree(index) + tree:
        _signal(process, signal.SIGCONT)
    return f"Dask host w{index + 1} cut off {seconds:.0f} s ({len(tree)} processes stopped)"


def _signal(process: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(sig)


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault("worker tree killed", ALL, False, _worker_tree_killed),
        Fault("rank killed", ("train",), True, _rank_killed),
        Fault("Dask worker killed", DURING_DATA, True, _dask_worker_killed),
        Fault("S3 down", ALL, True, _s3_down),
        Fault("PostgreSQL restarted", ALL, True, _postgres_restarted),
        Fault("MLflow down", ALL, True, _mlflow_down),
        Fault("registry reply lost", ("train",), True, _registry_reply_lost),
        Fault("Prefect server down", ALL, True, _prefect_down),
        Fault("disk full", (*DURING_DATA, "register"), False, _disk_full, needs_root=True),
        Fault("network cut", DURING_DATA, True, _network_cut),
    )
}


def can_fill_disk(root: Path) -> bool:
    """Whether the rig can give S3 a small disk of its own (a tmpfs: root only)."""
    return os.geteuid() == 0 and Path("/bin/mount").exists()
