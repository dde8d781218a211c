"""Ctrl-C while a run is in flight: recorded by a signal handler, acted on by the driver loop.

Python's default SIGINT handler raises ``KeyboardInterrupt`` at whatever bytecode the main thread
is running. Inside Dask, torch or logging internals that exception was swallowed (the run went
on training, seen about 1 time in 10 when Ctrl-C fell into cluster start-up) or turned into a
C++ abort. While a ``InterruptWatch`` is active, the first Ctrl-C only sets a flag; the driver
loop checks it between steps, stops every rank, and raises ``KeyboardInterrupt`` from a point
of its own. A second Ctrl-C raises at once, for a user who will not wait.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from trainlib._internal.driver.process_globals import DRIVER


class InterruptWatch:
    """Context manager: defers SIGINT to ``check()`` calls while active in the main thread.

    In any other thread it changes nothing (signal handlers belong to the main thread), and
    ``check()`` only reports interrupts recorded by an enclosing watch of the main thread (the
    flag is the process's: ``process_globals.DRIVER.interrupt_requested``).
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptWatch:
        if threading.current_thread() is threading.main_thread() and not _active_watch():
            DRIVER.interrupt_requested.clear()
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
            if kind is None and DRIVER.interrupt_requested.is_set():
                DRIVER.interrupt_requested.clear()
                raise KeyboardInterrupt  # Ctrl-C during the last steps of a run that finished
            DRIVER.interrupt_requested.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if DRIVER.interrupt_requested.is_set():
            raise KeyboardInterrupt  # the second Ctrl-C: stop waiting for an orderly stop
        DRIVER.interrupt_requested.set()

    @staticmethod
    def requested() -> bool:
        """True once Ctrl-C was pressed while a watch is active."""
        return DRIVER.interrupt_requested.is_set()

    @staticmethod
    def check() -> None:
        """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed (call it at safe points)."""
        if DRIVER.interrupt_requested.is_set():
            raise KeyboardInterrupt


def _active_watch() -> bool:
    handler = signal.getsignal(signal.SIGINT)
    return getattr(handler, "__self__", None).__class__ is InterruptWatch
