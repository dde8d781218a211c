"""Waiting on Dask futures with a timeout, without Dask's timed sync calls.

``Future.result(timeout=...)`` and ``distributed.wait(..., timeout=...)`` go through
``asyncio.timeout``; on Python 3.11, when the timeout fell just as the future finished, the
coroutine ended cancelled without a result or an error, and Dask's ``sync()`` raised
``UnboundLocalError`` (seen in a feeder thread, killing the rank's data stream). Here the
futures' done-callbacks set a ``threading.Event`` and only that is waited on with a timeout;
a Dask queue is read by a thread of its own (``Mailbox``), with ``get()`` never timed.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Future, Queue

from trainlib._internal.common import wire

_END = b""  # put on the queue to end the mailbox's thread
_FLUSH = b"flush"  # put on the queue to learn that everything before it was taken
_MAILBOX_WAIT_S = 10.0  # the longest a flush or close waits for the thread


class Completions:
    """Wakes a waiter when any of the futures it watches finishes (or fails, or is cancelled)."""

    def __init__(self, futures: Iterable[Future[Any]] = ()) -> None:
        self._event = threading.Event()
        for future in futures:
            self.watch(future)

    def watch(self, future: Future[Any]) -> None:
        """Also wake for ``future``."""
        future.add_done_callback(lambda _: self._event.set())

    def wake(self) -> None:
        """Wake the waiter now (something other than a future happened)."""
        self._event.set()

    def wait(self, timeout_s: float) -> bool:
        """Block until a watched future finished since the last wait, or ``timeout_s``."""
        woke = self._event.wait(timeout_s)
        self._event.clear()
        return woke


def result_within(
    future: Future[Any], timeout_s: float, give_up: Callable[[], bool] = lambda: False
) -> Any:
    """The future's result, polling ``give_up`` every ``timeout_s`` while it is not there.

    Raises:
        TimeoutError: ``give_up()`` returned True before the result came.
    """
    completions = Completions([future])
    while not future.done():
        if not completions.wait(timeout_s) and give_up():
            raise TimeoutError(f"gave up waiting for {future.key}")
    return future.result()


class Mailbox:
    """A thread that takes the ranks' messages off the Dask queue as they arrive.

    The driver's loop then wakes at once for a message instead of polling the scheduler
    (a live group's call returns within milliseconds of its last report). Blocking
    ``Queue.get()`` without a timeout: Dask's timed waits are unreliable on Python 3.11
    (see above); the thread ends on ``_END``.
    """

    def __init__(self, source: Queue, wake: Callable[[], None]) -> None:
        self._source = source
        self._wake = wake
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # decoded messages
        self._error: BaseException | None = None
        self._flushed = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="trainlib-mail", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        try:
            while (item := self._source.get()) != _END:
                if item == _FLUSH:
                    self._flushed.set()
                    continue
                self._inbox.put(wire.decode(item))
                self._wake()
        except BaseException as exc:  # the scheduler went away: tell the driver loop
            self._error = exc
            self._wake()

    def has_mail(self) -> bool:
        """True when messages wait to be taken."""
        return not self._inbox.empty()

    def take_all(self) -> list[Any]:
        """The messages that arrived so far, oldest first.

        Raises:
            The error that ended the thread, once the messages before it are taken.
        """
        taken = []
        while not self._inbox.empty():
            taken.append(self._inbox.get())
        if not taken and self._error is not None:  # set after every message before it
            raise self._error
        return taken

    def flush(self) -> None:
        """Wait (bounded) until every message already on the Dask queue has been taken.

        A supervisor's last message is on the queue before its task ends, but may reach this
        process after the task's end does (another connection).
        """
        if not self._thread.is_alive():
            return
        self._flushed.clear()
        try:
            self._source.put(_FLUSH)
        except Exception:
            return  # the scheduler is gone: take_all() raises what the thread saw
        self._flushed.wait(_MAILBOX_WAIT_S)

    def close(self) -> None:
        """End the thread (bounded wait)."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._source.put(_END)
            self._thread.join(_MAILBOX_WAIT_S)
