"""The driver's pulse: how the ranks know their driver is still there, so they stop before
anything it holds on the cluster can lapse (``DaskConfig(driver_timeout_s=)``).

A driver that is frozen (SIGSTOP, a paused container, swap) or cut off from the scheduler keeps
its client's connection open, so Dask cancels none of its ranks' tasks; what it holds on the
cluster by a lease (a ``distributed.Semaphore`` slot, a GPU claim) lapses after the lease
timeout while its ranks train on, beside whichever run takes the lease next. With a timeout T,
the driver sets a Dask ``Variable`` to a new count every T/4 s from a thread of its own
(``PulseSender``), and each supervisor stops its rank once it has seen no new count for T s on
its own monotonic clock (``PulseWatch``; a scheduler it cannot reach is silence too). Holding a
lease whose timeout is longer than T, the driver's ranks are gone before the lease can lapse;
and a driver that finds it missed its own beats for T s (it was frozen) takes its ranks for
fenced whatever they said, so it never trains on with a lease it may have lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from distributed import Client, Variable

logger = logging.getLogger(__name__)

_READ_EVERY_S = 1.0  # at most: a supervisor's reads of the pulse


def fence_summary(silent_s: float, timeout_s: float) -> str:
    """Why a rank stopped itself: one line for ``RankFailure.summary``."""
    return (
        f"stopped itself: its driver was not heard from for {silent_s:.0f} s "
        f"(DaskConfig(driver_timeout_s={timeout_s:g})): the driver was frozen, paused or cut "
        "off from the scheduler, so what it held on the cluster may have lapsed; run it again "
        "to resume from the latest checkpoint"
    )


class PulseSender:
    """The driver's side: a new count every ``timeout_s / 4`` seconds while the group lives."""

    def __init__(self, client: Client, name: str, timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        self._variable = Variable(name, client=client)
        self._variable.set(0)  # before any supervisor starts watching
        self._last_beat = time.monotonic()
        self._lapsed_for: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trainlib-pulse", daemon=True)
        self._thread.start()

    def lapsed(self) -> float | None:
        """How long the driver went without a beat, once that was longer than the timeout
        (its ranks stopped themselves); None while every beat came in time."""
        if self._lapsed_for is None:
            silent = time.monotonic() - self._last_beat
            if silent > self.timeout_s:
                self._lapsed_for = silent
        return self._lapsed_for

    def close(self) -> None:
        """Stop beating and remove the variable."""
        self._stop.set()
        self._thread.join(self.timeout_s)
        with contextlib.suppress(Exception):  # the scheduler may be gone
            self._variable.delete()

    def _beat(self) -> None:
        count = 0
        while not self._stop.wait(self.timeout_s / 4):
            self.lapsed()  # a beat that comes too late does not make the silence undone
            count += 1
            try:
                self._variable.set(count, timeout=self.timeout_s / 4)
            except Exception as exc:  # the scheduler cannot be reached: silence, as it is
                logger.debug("The driver's pulse could not be sent: %s", exc)
                continue
            self._last_beat = time.monotonic()


class PulseWatch:
    """A supervisor's side: when its driver's pulse last changed, read by a thread of its own
    (a read the scheduler does not answer blocks only that thread)."""

    def __init__(self, client: Client, name: str, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._variable = Variable(name, client=client)
        self._changed = time.monotonic()
        self._stop = threading.Event()
        threading.Thread(target=self._read, name="trainlib-pulse-watch", daemon=True).start()

    def silent_for(self) -> float | None:
        """How long the pulse has not changed, once that is longer than the timeout."""
        silent = time.monotonic() - self._changed
        return silent if silent > self.timeout_s else None

    def close(self) -> None:
        """Stop reading (the thread ends after its read in progress)."""
        self._stop.set()

    def _read(self) -> None:
        every = min(_READ_EVERY_S, self.timeout_s / 8)
        last: object = None
        while not self._stop.wait(every):
            try:
                count = self._variable.get(timeout=self.timeout_s)
            except Exception:  # not answered: silence
                continue
            if count != last:
                last, self._changed = count, time.monotonic()
