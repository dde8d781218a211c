"""Runs inside a Dask worker: starts one rank process, relays its messages, stops it.

A rank is a plain (non-daemonic) OS process leading its own process group, so it may start
DataLoader workers, and it can be killed with everything it started without touching the Dask
worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from distributed import Event, Queue, get_client, get_worker, secede

from trainlib._internal.common import device_holds, wire
from trainlib._internal.common.devices import pinned_to_own_cores, usable_cores
from trainlib._internal.common.driver_pulse import PulseWatch, fence_summary
from trainlib._internal.common.messages import (
    DataRequest,
    DriverMessage,
    RankDone,
    RankLaunch,
    RankMessage,
    RankStartup,
    is_private,
)
from trainlib._internal.common.scheduler_rpc import worker_scheduler_address
from trainlib._internal.worker import command_relay, rank_pool
from trainlib._internal.worker.feeder import Feeder
from trainlib._internal.worker.fork_client import LOST, ForkedProcess
from trainlib.errors import RankFailure

_POLL_S = 0.5  # a message or the rank's exit wakes the supervisor sooner
_STOP_CHECK_S = 0.5
_EXIT_WAIT_S = 5.0
_CLOSED = object()  # the rank's end of the connection is closed
_TERMINATE_GRACE_S = 3.0


@dataclass(frozen=True)
class RankOutcome:
    """How a rank ended: ``failure`` is None when its train function returned."""

    world_rank: int
    failure: RankFailure | None


def supervise_rank(
    launch: RankLaunch, queue_name: str, stop_event_name: str, pulse_name: str | None = None
) -> RankOutcome:
    """Run one rank to its end, forwarding its messages to the driver's queue.

    Stops the rank when the stop event is set (another rank failed), or when the driver's
    pulse ``pulse_name`` stayed silent for ``launch.driver_timeout_s`` (``driver_pulse``), and
    sets the event itself when this rank fails, so the others stop without waiting for the
    driver.
    """
    secede()  # this task only waits on its rank: the worker's thread is free for data tasks
    worker = get_worker().address
    queue, stop = Queue(queue_name), Event(stop_event_name)
    pulse = None
    if pulse_name is not None and launch.driver_timeout_s is not None:
        pulse = PulseWatch(get_client(), pulse_name, launch.driver_timeout_s)
    environment = rank_pool.process_environment(dict(os.environ))
    rank = rank_pool.take(worker, environment)
    send = _locked(rank.connection.send)
    feeder = Feeder(launch.feed, get_client(), send) if launch.feed is not None else None
    command_relay.register(queue_name, worker, send)  # a live group's commands (see there)
    try:
        send(
            RankStartup(
                launch.world_rank,
                launch.host,
                launch.sys_path,
                os.getcwd(),
                launch_environment(launch, environment, worker_scheduler_address()),
                launch.spec_payload,
            )
        )
        outcome = _relay(launch, rank.process, rank.connection, queue, stop, feeder, pulse)
    finally:
        if pulse is not None:
            pulse.close()
        command_relay.unregister(queue_name, worker)
        if feeder is not None:
            feeder.close()
        _kill_session(rank.process)
        rank.connection.close()
        if feeder is not None:
            feeder.join()  # its partitions released before the driver sees this task end
    if outcome.failure is not None and outcome.failure.kind != "stopped":
        stop.set()
    return outcome


def launch_environment(
    launch: RankLaunch, process_env: dict[str, str], scheduler_address: str | None = None
) -> dict[str, str]:
    """What a rank sets in its environment when it starts: torchrun's variables, its share of
    the worker's cores for OpenMP and for Inductor's compile workers (unless set already),
    with GPUs the devices it sees (chosen by the driver: see ``devices``) numbered in PCI bus
    order unless the worker's environment sets ``CUDA_DEVICE_ORDER`` itself, the scheduler of
    its cluster as Dask's default (a run started inside a rank, as in a Tune trial, runs on
    the same cluster), and the private variables as they are now (an idle process may have
    started with others)."""
    env = {k: v for k, v in process_env.items() if is_private(k)}
    env.update(launch.torch_environment)
    if (
        scheduler_address is not None
        and not scheduler_address.startswith("inproc://")  # another process cannot connect
        and "DASK_SCHEDULER_ADDRESS" not in process_env
    ):
        env["DASK_SCHEDULER_ADDRESS"] = scheduler_address
    share = str(thread_share(usable_cores(), launch.local_world_size, pinned_to_own_cores()))
    for variable in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        if variable not in process_env:
            env[variable] = share
    if launch.use_gpu and launch.visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.visible_devices)
        if "CUDA_DEVICE_ORDER" not in process_env:  # the user's own order is kept
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # indices as the placement read them (NVML's)
        if launch.device_hold is not None:
            env[device_holds.HOLD_VARIABLE] = launch.device_hold
    return env


def thread_share(cpu_count: int | None, local_world_size: int, pinned: bool = False) -> int:
    """A rank's share of its worker's cores: divided between the host's ranks, unless the
    worker was pinned to cores of its own (then they are the share already: dividing again
    would leave a dask-cuda rank a quarter of its cores); at least one thread each."""
    return max(1, (cpu_count or 1) // (1 if pinned else local_world_size))


def _locked(send: Callable[[Any], None]) -> Callable[[Any], None]:
    """``send``, serialised: feeder threads and this one write to the same connection."""
    lock = threading.Lock()

    def locked_send(message: Any) -> None:
        with lock:
            send(message)

    return locked_send


def _relay(
    launch: RankLaunch,
    process: ForkedProcess,
    connection: Connection,
    queue: Queue,
    stop: Event,
    feeder: Feeder | None,
    pulse: PulseWatch | None,
) -> RankOutcome:
    state = _RankTranscript(feeder)
    next_stop_check = 0.0
    while True:
        message = _receive(connection, _POLL_S)
        if message is _CLOSED:  # every copy of the rank's end is closed: it is exiting
            code = _wait(process)
            break
        if not state.take(message, queue):
            exit_code = process.poll()
            if exit_code is not None:
                while state.take(_receive(connection, 0), queue):
                    pass  # messages sent just before the exit
                code = exit_code
                break
        # Checked whether or not a message came: a rank that reports more often than
        # _POLL_S must still be stopped (a pruned trial's rank reports at every step).
        if time.monotonic() >= next_stop_check:
            next_stop_check = time.monotonic() + _STOP_CHECK_S
            if pulse is not None and (silent := pulse.silent_for()) is not None:
                _kill_session(process, grace_s=_TERMINATE_GRACE_S)
                return RankOutcome(launch.world_rank, fenced(launch, silent, pulse.timeout_s))
            if stop.is_set() or _task_cancelled():
                _kill_session(process, grace_s=_TERMINATE_GRACE_S)
                summary = "stopped after another rank failed"
                return RankOutcome(
                    launch.world_rank, state.error or _failure(launch, "stopped", summary)
                )
    if state.error is not None:
        return RankOutcome(launch.world_rank, state.error)
    if state.finished and code in (0, LOST):  # LOST: said done; its exit code is unknown
        return RankOutcome(launch.world_rank, None)
    return RankOutcome(launch.world_rank, exit_failure(launch, code))


class _RankTranscript:
    """What the rank has said so far: its error report, or that it finished."""

    def __init__(self, feeder: Feeder | None) -> None:
        self.error: RankFailure | None = None
        self.finished = False
        self._feeder = feeder

    def take(self, message: RankMessage | object | None, queue: Queue) -> bool:
        """Act on one message; False when there was none."""
        if message is None or message is _CLOSED:
            return False
        if isinstance(message, DriverMessage):
            queue.put(wire.encode(message))
        elif isinstance(message, DataRequest) and self._feeder is not None:
            self._feeder.request(message.dataset, message.pass_id)
        elif isinstance(message, RankFailure):
            self.error = message
        elif isinstance(message, RankDone):
            self.finished = True
        return True


def _task_cancelled() -> bool:
    """True once Dask cancelled this task: the driver cancelled it, or its client went away
    (the driver died), so nobody waits for this rank any more."""
    worker = get_worker()
    state = worker.state.tasks.get(worker.get_current_task())
    return state is None or state.state == "cancelled"


def _receive(connection: Connection, timeout_s: float) -> RankMessage | object | None:
    """The next message, ``_CLOSED`` once the rank's end is closed, or None after timeout_s."""
    try:
        if connection.poll(timeout_s):
            message: RankMessage = connection.recv()
            return message
    except (EOFError, OSError):
        return _CLOSED
    return None


def _wait(process: ForkedProcess) -> int:
    """The exit code of a rank that is exiting; killed if it lingers."""
    try:
        return process.wait(timeout=_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        _kill_session(process)
        return process.wait()


def _failure(launch: RankLaunch, kind: Any, summary: str) -> RankFailure:
    return RankFailure(launch.world_rank, launch.host, kind, summary, time=time.time())


def fenced(launch: RankLaunch, silent_s: float, timeout_s: float) -> RankFailure:
    """The rank stopped because its driver was not heard from for ``silent_s`` seconds."""
    return _failure(launch, "fenced", fence_summary(silent_s, timeout_s))


def exit_failure(launch: RankLaunch, code: int) -> RankFailure:
    """A rank that exited without reporting an error. A GPU rank aborted (SIGABRT) is NCCL's
    watchdog ending a collective that outlived the collective timeout: a consequence of a peer
    that hung or died, so another rank's failure is the root cause where there is one."""
    if launch.use_gpu and code == -signal.SIGABRT:
        summary = (
            "rank process was aborted (SIGABRT), as NCCL's watchdog does when a collective does "
            "not complete within TorchConfig(timeout_s): another rank hung or died (see the "
            "other ranks; FailureConfig(hang_timeout_s) names a hung one sooner)"
        )
        return replace(_failure(launch, "exit", summary), is_collective_error=True)
    return _failure(launch, "exit", _describe_exit(code))


def _describe_exit(code: int) -> str:
    if code == LOST:
        return (
            "rank process ended without reporting an error; its exit code is unknown: the "
            "worker's rank process server (trainlib-spare) died first (killed, out of memory?)"
        )
    if code < 0:
        return f"rank process was killed by signal {signal.Signals(-code).name}"
    return f"rank process exited with code {code} without reporting an error"


def _kill_session(process: ForkedProcess, grace_s: float = 0.0) -> None:
    """Stop the rank and every process it started (it leads its own process group)."""
    if grace_s and process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
