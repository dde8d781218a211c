"""The worker's side of a fork server (``rank.fork_server``): ask for a rank process, follow it.

A forked rank is the server's child, not the worker's, so the worker cannot wait for it
itself: the server reports each exit, and ``ForkedProcess`` offers what the supervisor uses of
``subprocess.Popen`` (``pid``, ``poll()``, ``wait()``). Should the server die first, its
children's ends are watched with psutil; their exit codes are then unknown (``LOST``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

import psutil

from trainlib._internal.common.messages import Forked, ForkRequest, RankExited

LOST = 255  # the exit code of a rank whose fork server died before it: unknown


class ForkServerGone(RuntimeError):
    """The fork server exited (killed, out of memory) before it answered."""


class ForkedProcess:
    """A rank process forked by a fork server: the part of ``Popen`` the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class ForkServer:
    """A started fork server (it imports torch first; ``fork()`` waits for that)."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.environment = environment
        ours, theirs = multiprocessing.Pipe(duplex=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainlib._internal.rank.rank_main", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=environment,
            start_new_session=True,  # stopping it never signals the worker
        )
        theirs.close()
        self._connection = ours
        self._request_lock = threading.Lock()  # one fork at a time: replies come in order
        self._replies: queue.SimpleQueue[tuple[ForkedProcess, Connection] | None] = (
            queue.SimpleQueue()
        )
        self._children: dict[int, ForkedProcess] = {}
        self._gone = threading.Event()  # its end of the connection closed
        threading.Thread(target=self._follow, name="trainlib-fork-server", daemon=True).start()

    def fork(self) -> tuple[ForkedProcess, Connection]:
        """A new rank process, waiting for its launch on the returned connection.

        Raises:
            ForkServerGone: The server exited before it answered.
        """
        with self._request_lock:
            try:
                self._connection.send(ForkRequest())
            except OSError as exc:
                raise ForkServerGone(f"fork server {self.process.pid} is gone") from exc
            reply = self._replies.get()
        if reply is None:
            self._replies.put(None)  # for any later request too
            raise ForkServerGone(f"fork server {self.process.pid} is gone")
        return reply

    def has_children(self) -> bool:
        return bool(self._children)

    def alive(self) -> bool:
        return not self._gone.is_set() and self.process.poll() is None

    def stop(self) -> None:
        """Stop the server; ranks it forked go on (they end with their own connections)."""
        self._connection.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 9)
        self.process.wait()

    def _follow(self) -> None:
        """The server's messages: fork replies, in request order, and its children's exits."""
        try:
            while True:
                message: Forked | RankExited = self._connection.recv()
                if isinstance(message, Forked):
                    child = ForkedProcess(message.pid)
                    self._children[child.pid] = child
                    connection = Connection(recv_handle(self._connection))
                    self._replies.put((child, connection))
                else:
                    self._children.pop(message.pid).ended(message.code)
        except (EOFError, OSError):
            self._gone.set()
            self._replies.put(None)
            lost, self._children = list(self._children.values()), {}
            if lost:
                threading.Thread(target=_watch_orphans, args=(lost,), daemon=True).start()


def _watch_orphans(children: list[ForkedProcess]) -> None:
    """Mark each child of a dead server ended (code ``LOST``) once its process is gone."""
    processes = []
    for child in children:
        try:
            processes.append(psutil.Process(child.pid))
        except psutil.NoSuchProcess:
            child.ended(LOST)
    by_pid = {child.pid: child for child in children}
    psutil.wait_procs(processes, callback=lambda gone: by_pid[gone.pid].ended(LOST))
