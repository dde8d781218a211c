"""A Dask worker's fork server: one process with torch imported that forks the worker's ranks.

Importing torch and what DDP needs takes a rank process seconds of CPU (4 s on a busy 2-core
machine). The server pays it once per worker; each rank is then a ``fork()`` of it, about 10 ms,
so every run after the first on a cluster starts warm, and so do a search's back-to-back trials,
with no idle process to refill. The server never runs torch code itself: no OpenMP pool, no
CUDA context, nothing a forked child could inherit half-started.

Protocol on the worker's connection (``FORK_REQUEST`` and the replies in ``messages``): for each
request the server forks; the child leads a session of its own and keeps one end of a new socket
pair; the server replies ``(FORKED, pid)`` and passes the other end (``SCM_RIGHTS``). It reaps
its children (it is their parent) and reports each exit as ``(EXITED, pid, code)``, with Popen's
codes (negative: the signal). When the worker closes its end (it closed or died) the server
exits; its children go on until their own connections close.
"""

from __future__ import annotations

import os
import random
import sys
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import send_handle

from trainlib._internal.common.messages import EXITED, FORKED


def serve(worker: Connection) -> Connection:
    """Fork a rank process per request until the worker closes its end, then exit.

    Returns only in a forked child: that child's connection to the worker.
    """
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for ready in wait([worker, *children]):
            if ready is worker:
                try:
                    worker.recv()
                except (EOFError, OSError):
                    os._exit(0)  # the worker is gone; the ranks notice on their own
                ours, theirs = Pipe(duplex=True)
                pid = os.fork()
                if pid == 0:
                    _become_rank(worker, ours, children)
                    return theirs
                theirs.close()
                worker.send((FORKED, pid))
                send_handle(worker, ours.fileno(), pid)
                ours.close()
                children[os.pidfd_open(pid)] = pid
            else:
                assert isinstance(ready, int)
                pid = children.pop(ready)
                os.close(ready)
                _, status = os.waitpid(pid, 0)
                worker.send((EXITED, pid, os.waitstatus_to_exitcode(status)))


def _become_rank(worker: Connection, ours: Connection, children: dict[int, int]) -> None:
    """In the child: drop the server's descriptors, lead a session, and draw fresh random
    seeds where a new process would (Python's ``random`` does so itself at fork)."""
    worker.close()
    ours.close()
    for pidfd in children:
        os.close(pidfd)
    children.clear()
    os.setsid()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # seeded from the OS at import in a new process
    random.seed()
