"""One training at a time on the Dask cluster, held by the cluster's own scheduler, and on this
host's loopback clusters, by a lock of the host.

The slot is a ``distributed.Semaphore`` on the cluster's scheduler, held by the training's Dask
client while it trains: it lives as long as the training does, whatever the Prefect API does,
and lapses ``LEASE_TIMEOUT_S`` after its holder's last refresh (the lease timeout it registers;
the scheduler keeps the first registration's until it restarts). A holder that stops refreshing
without leaving (frozen, paused, cut off from the scheduler) is fenced: its training runs with
``DaskConfig(driver_timeout_s=)`` half the lease, so its ranks stop themselves before the lease
can lapse and let a queued training in, and the training fails (``fenced``) instead of going on
without the slot; the train task's retry waits for the slot again and resumes.
A cluster on loopback (a run's own ``LocalCluster``) shares this host's cores with every other
one, and a run's own scheduler sees no other run: there the training also holds one of the
host's slot files (``flock``, released by the kernel when its process ends, however it ends).

No Prefect concurrency limit takes part, and the training tasks carry no tag: Prefect's task
engine asks the API for a tagged task's slots with a client that has not yet connected, which
gives up at once while the server is down (the run then Failed with
``ConcurrencySlotAcquisitionError``: seen in the soak), and its lease lapses during an outage
longer than a minute while the training goes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import dask
from distributed import Client, Semaphore

from trainlib import DaskConfig
from trainlib._internal.common.scheduler_rpc import lease, register_lease, scheduler_address

logger = logging.getLogger(__name__)

SLOTS_VARIABLE = "CIFAR_TRAINING_SLOTS"  # the worker's: how many trainings at once
LOCK_DIR_VARIABLE = "CIFAR_TRAINING_LOCK_DIR"  # the host's slot files; default in the temp dir
SEMAPHORE = "cifar-training"
WAIT_LOG_S = 60.0
LEASE_TIMEOUT_S = 60.0  # the slot lapses this long after its holder's last refresh


def training_slots() -> int:
    """How many trainings the cluster takes at once: ``$CIFAR_TRAINING_SLOTS``, else 1."""
    configured = os.environ.get(SLOTS_VARIABLE, "1")
    if not configured.isdigit() or int(configured) < 1:
        raise ValueError(
            f"{SLOTS_VARIABLE}={configured!r} must be a whole number of trainings, 1 or more; "
            "fix the worker's environment"
        )
    return int(configured)


@contextmanager
def training_slot(
    dask_config: DaskConfig, run_name: str, lease_timeout_s: float = LEASE_TIMEOUT_S
) -> Iterator[DaskConfig]:
    """Hold one of the cluster's training slots while the block runs; wait for one first
    (saying so every minute). ``dask_config`` names the running cluster (``attached_to``);
    the block trains with the config it is given: its ranks stop when the holder is silent
    for half ``lease_timeout_s``."""
    with dask_config.connect() as client, contextlib.ExitStack() as held:
        if on_loopback(scheduler_address(client)):
            held.enter_context(_host_slot(run_name))
        held.enter_context(_cluster_slot(client, run_name, lease_timeout_s))
        logger.info("Training %s holds the training slot", run_name)
        try:
            yield replace(dask_config, driver_timeout_s=lease_timeout_s / 2)
        finally:
            logger.info("Training %s releases the training slot", run_name)


def on_loopback(address: str) -> bool:
    """Whether a scheduler ``address`` (``tcp://127.0.0.1:8786``) is on this host's loopback
    (or in this process: ``inproc://``)."""
    parts = urlsplit(address)
    if parts.scheme == "inproc":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def _cluster_slot(client: Client, run_name: str, lease_timeout_s: float) -> Iterator[None]:
    with dask.config.set({"distributed.scheduler.locks.lease-timeout": f"{lease_timeout_s}s"}):
        semaphore = lease(client, Semaphore, SEMAPHORE, training_slots())  # refreshes: 1/5 of it
        register_lease(client, semaphore)  # with this lease timeout, unless registered before
    started = time.monotonic()
    while not semaphore.acquire(timeout=WAIT_LOG_S):
        _waiting(run_name, "the cluster's training slot", started)
    try:
        yield
    finally:
        semaphore.release()
        if (refresh := getattr(semaphore, "refresh_callback", None)) is not None:
            refresh.stop()  # (close() would delete the semaphore for every client)


@contextmanager
def _host_slot(run_name: str) -> Iterator[None]:
    folder = lock_dir()
    files = [
        os.open(folder / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        for i in range(training_slots())
    ]
    started = logged = time.monotonic()
    try:
        while (held := _lock_any(files)) is None:
            if time.monotonic() - logged >= WAIT_LOG_S:
                _waiting(run_name, "this host's training slot", started)
                logged = time.monotonic()
            time.sleep(random.uniform(0.5, 1.5))  # a lock file gives no wake-up to wait on
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    finally:
        for fd in files:
            os.close(fd)


def lock_dir() -> Path:
    """The folder of this host's slot files (made, open to every user, if missing)."""
    folder = Path(
        os.environ.get(LOCK_DIR_VARIABLE) or Path(tempfile.gettempdir(), "cifar-training-slots")
    )
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a folder another user made
            folder.chmod(0o1777)
    return folder


def _lock_any(files: list[int]) -> int | None:
    for fd in files:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            continue
    return None


def _waiting(run_name: str, slot: str, started: float) -> None:
    logger.warning(
        "Training %s waits for %s (another training holds it; %.0f s so far)",
        run_name,
        slot,
        time.monotonic() - started,
    )
