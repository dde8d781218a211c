"""Entry point of a worker's rank processes: ``python -m trainlib._internal.rank.rank_main FD``.

The process started so is the worker's fork server (``fork_server``): it imports what every rank
needs once, then forks a rank per request of the worker's pool on FD. A forked rank gets a
socket pair of its own; the supervisor (in the Dask worker) sends the launch message on it:
rank, host, the driver's ``sys.path`` and the pickled ``RankSpec``, loaded only once that path
applies (it may reference the user's modules). The rank joins the process group, runs the train
function, and sends reports, rank 0's log records, and finally ``done`` or ``error`` back. If
the supervisor goes away (its Dask worker died), the connection closes and the rank exits at
once.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import importlib
import logging
import logging.handlers
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import NoReturn

import cloudpickle

from trainlib._internal.common import preemption_signal
from trainlib._internal.common.messages import (
    RankDone,
    RankLog,
    RankMessage,
    RankSpec,
    RankStarted,
    RankStartup,
    is_private,
)
from trainlib._internal.rank import backend, fork_server
from trainlib._internal.rank.process_globals import RANK
from trainlib._internal.rank.session import Session
from trainlib.errors import RankFailure
from trainlib.logging_config import LOGGER

_EXIT_FAILED = 1
_EXIT_ORPHANED = 70
_PRELOADED_FRONT_ENDS = ("trainlib.data", "trainlib.torch")


class _LogForwarder:
    """A queue for ``logging.handlers.QueueHandler`` that sends records to the supervisor."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def put_nowait(self, record: logging.LogRecord) -> None:
        self._session.send(RankLog(record))


def _receive_until_orphaned(connection: Connection, session: Session) -> None:
    """File the supervisor's messages; when its end of the connection closes, exit at once."""
    try:
        while True:
            session.deliver(connection.recv())
    except (EOFError, OSError):
        os._exit(_EXIT_ORPHANED)


def _forward_logs(session: Session, trainlib_level: int) -> None:
    """Rank 0's records to the driver: the training function's at INFO and above, trainlib's
    at its ``LoggingConfig`` level."""
    handler = logging.handlers.QueueHandler(_LogForwarder(session))  # type: ignore[arg-type]
    handler.setLevel(min(logging.INFO, trainlib_level))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def _failure(world_rank: int, host: str, exc: BaseException) -> RankFailure:
    return RankFailure(
        world_rank=world_rank,
        host=host,
        kind="exception",
        summary=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc)),
        time=time.time(),
        is_collective_error=backend.is_collective_error(exc),
    )


def _run(spec: RankSpec, session: Session) -> None:
    # Unpickling imports the user's modules, which may configure logging (Prefect does), so
    # rank 0 starts forwarding its log records only afterwards.
    train_func = cloudpickle.loads(spec.train_func_payload)
    logging.getLogger(LOGGER).setLevel(spec.log_level)
    if spec.world_rank == 0:
        _forward_logs(session, spec.log_level)
    if spec.setup_payload is not None:
        cloudpickle.loads(spec.setup_payload)()  # before the group: it may set NCCL's variables
    backend.init_process_group(
        spec.backend, spec.timeout_s, spec.use_gpu, spec.host, spec.device_index
    )
    session.send(RankStarted.here(spec.world_rank, spec.host))
    train_func()
    session.uploads.wait()  # a checkpoint still uploading (async): its failure fails the rank
    backend.destroy_process_group()  # on failure the process just exits


def _prepare() -> None:
    """What every rank needs, imported by the fork server before its first fork.
    DistributedDataParallel imports torch._dynamo when it is built: 4 s on a busy 2-core
    machine, at the start of the first epoch."""
    import torch
    import torch._dynamo
    import torch.distributed  # noqa: F401

    # The front ends a training function calls, loaded by name: the engine uses nothing of
    # them (they import it), it only spares the user's function their import time.
    for front_end in _PRELOADED_FRONT_ENDS:
        importlib.import_module(front_end)


def _load_spec(connection: Connection) -> RankSpec:
    """Wait for the launch message and apply it: environment, working directory, the driver's
    sys.path; the spec is loaded last (it may reference the user's modules)."""
    try:
        startup: RankStartup = connection.recv()
    except (EOFError, OSError):
        os._exit(_EXIT_ORPHANED)  # never launched: the worker closed or died
    _name_process("trainlib-rank")
    world_rank, host, environment = startup.world_rank, startup.host, startup.environment
    for gone in RANK.started_with.keys() - environment.keys():
        if is_private(gone):  # the launch carries the private variables of now
            os.environ.pop(gone, None)
    os.environ.update(environment)
    # torch read OMP_NUM_THREADS in the fork server, and a fork resets its pool to the default:
    # applied here, as a new process would (the launch's thread share, or the worker's own)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    # Inductor sized its compile pool from the fork server's cores when torch._dynamo was
    # imported: sized again from the launch's share (one pool per rank, not per core)
    compile_threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "")
    if compile_threads.isdigit() and int(compile_threads) > 0:
        import torch._inductor.config

        torch._inductor.config.compile_threads = int(compile_threads)
    if "dask" in sys.modules and "DASK_SCHEDULER_ADDRESS" in os.environ:  # read at import
        import dask.config

        dask.config.set({"scheduler-address": os.environ["DASK_SCHEDULER_ADDRESS"]})
    sys.path[:0] = [p for p in startup.sys_path if p not in sys.path]
    try:
        os.chdir(startup.cwd)
        spec: RankSpec = cloudpickle.loads(startup.spec_payload)
    except BaseException as exc:
        _exit_failed(connection.send, _failure(world_rank, host, exc))
    return spec


def _name_process(name: str) -> None:
    """Name this process (``ps -o comm``, psutil's ``name()``): ``trainlib-spare`` for the fork
    server, ``trainlib-rank`` once a forked rank is launched. Linux only; elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # 15 = PR_SET_NAME


def _exit_failed(send: Callable[[RankMessage], None], failure: RankFailure) -> NoReturn:
    send(failure)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_FAILED)


def main(fd: int) -> None:
    RANK.started_with.update(os.environ)
    _name_process("trainlib-spare")
    preemption_signal.ignore_sigterm_while_preempting()  # inherited by every rank it forks
    _prepare()
    connection = fork_server.serve(Connection(fd))  # returns in a forked rank only
    spec = _load_spec(connection)
    session = Session(spec, connection.send)
    RANK.start(session)
    threading.Thread(
        target=_receive_until_orphaned, args=(connection, session), daemon=True
    ).start()
    try:
        _run(spec, session)
    except BaseException as exc:
        session.uploads.abandon()
        _exit_failed(session.send, _failure(spec.world_rank, spec.host, exc))
    session.send(RankDone())
    gc.freeze()  # the exit's last collection of torch's objects took 1.1-1.4 s, frozen 0.3-0.5


if __name__ == "__main__":
    main(int(sys.argv[1]))
