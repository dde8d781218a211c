"""A Dask worker's fork server: one process with torch imported that forks the worker's ranks.

Importing torch and what DDP needs takes a rank process seconds of CPU (4 s on a busy 2-core
machine). The server pays it once per worker; each rank is then a ``fork()`` of it, about 10 ms,
so every run after the first on a cluster starts warm, and so do a search's back-to-back trials,
with no idle process to refill. The server never runs torch code itself: no OpenMP pool, no
CUDA context, nothing a forked child could inherit half-started.

Protocol on the worker's connection (``ForkRequest`` and the replies in ``messages``): for each
request the server forks; the child leads a process group of its own and keeps one end of a new
socket pair; the server replies ``Forked(pid)`` and passes the other end (``SCM_RIGHTS``). It
reaps its children (it is their parent) and reports each exit as ``RankExited(pid, code)``, with
Popen's codes (negative: the signal). When the worker closes its end (it closed or died) the
server exits; its children go on until their own connections close.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import send_handle

from trainlib._internal.common.messages import Forked, RankExited

_REAP_POLL_S = 0.1


def serve(worker: Connection) -> Connection:
    """Fork a rank process per request until the worker closes its end, then exit.

    Returns only in a forked child: that child's connection to the worker. Any error of the
    server's own (the worker gone mid-reply, no memory to fork) ends it: the worker then starts
    another, or says so.
    """
    try:
        return _serve(worker)
    except OSError:
        os._exit(0)


def _serve(worker: Connection) -> Connection:
    children: dict[int, int | None] = {}  # pid -> its pidfd (None where there are none)
    while True:
        pidfds = [fd for fd in children.values() if fd is not None]
        # a pidfd wakes the server when its child exits; without pidfds (not Linux) it looks
        # for ended children every _REAP_POLL_S
        polled = bool(children) and not hasattr(os, "pidfd_open")
        if worker in wait([worker, *pidfds], timeout=_REAP_POLL_S if polled else None):
            try:
                worker.recv()
            except (EOFError, OSError):
                os._exit(0)  # the worker is gone; the ranks notice on their own
            ours, theirs = Pipe(duplex=True)
            pid = os.fork()
            if pid == 0:
                _become_rank(worker, ours, children)
                return theirs
            with contextlib.suppress(ProcessLookupError):  # it may have died already
                os.setpgid(pid, pid)  # also done by the child: whichever runs first
            theirs.close()
            worker.send(Forked(pid))
            send_handle(worker, ours.fileno(), pid)
            ours.close()
            children[pid] = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        _reap(worker, children)


def _reap(worker: Connection, children: dict[int, int | None]) -> None:
    """Report every child that has ended since the last look."""
    for pid, pidfd in list(children.items()):
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            del children[pid]
            if pidfd is not None:
                os.close(pidfd)
            worker.send(RankExited(pid, os.waitstatus_to_exitcode(status)))


def _become_rank(worker: Connection, ours: Connection, children: dict[int, int | None]) -> None:
    """In the child: drop the server's descriptors, lead a process group (the supervisor stops
    a rank with everything it started by signalling the group; set by the server as well, so
    it holds before the worker hears of the child), and draw fresh random seeds where a new
    process would (Python's ``random`` does so itself at fork)."""
    worker.close()
    ours.close()
    for pidfd in children.values():
        if pidfd is not None:
            os.close(pidfd)
    children.clear()
    os.setpgid(0, 0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # seeded from the OS at import in a new process
    random.seed()
