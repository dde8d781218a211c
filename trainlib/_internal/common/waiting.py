"""Waiting on Dask futures with a timeout, without Dask's timed sync calls.

``Future.result(timeout=...)`` and ``distributed.wait(..., timeout=...)`` go through
``asyncio.timeout``; on Python 3.11, when the timeout fell just as the future finished, the
coroutine ended cancelled without a result or an error, and Dask's ``sync()`` raised
``UnboundLocalError`` (seen in a feeder thread, killing the rank's data stream). Here the
futures' done-callbacks set a ``threading.Event`` and only that is waited on with a timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Future


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
