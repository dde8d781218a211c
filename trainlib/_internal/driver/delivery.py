"""Delivery of tracking callbacks' records: in order, each once, on a thread, through outages.

A run calls its callbacks through ``with_delivery(callbacks)``: a ``TrackingCallback`` there is
replaced by its ``Delivery``, which queues its records (``on_start``, ``on_report``,
``on_end``) for a thread of its own and makes its group and failure calls in place, never
raising.
``end_run`` tells every callback the run ended, then waits for the deliveries (each bounded by
its tracker's ``outage_tolerance_s``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainlib.callbacks import Callback, GroupInfo, Report, RunInfo, TrackingCallback
from trainlib.errors import WorkerGroupError
from trainlib.result import Result

logger = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0


@dataclass(frozen=True)
class _Record:
    method: str  # on_start, on_report or on_end
    argument: Any

    def describe(self) -> str:
        if isinstance(self.argument, Report):
            return f"report {self.argument.index}"
        return {"on_start": "the run's start", "on_end": "the run's end"}[self.method]


class Delivery(Callback):
    """Stands in for one ``TrackingCallback`` in a run (see its docstring for the contract)."""

    def __init__(
        self, tracker: TrackingCallback, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tracker = tracker
        self._clock = clock
        self._queue: deque[_Record] = deque()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._head_since: float | None = None  # when the head record's first try began
        self._outage_since: float | None = None  # when the head record's first try failed
        self._told_past_bound = False

    @property
    def _name(self) -> str:
        return f"{type(self.tracker).__name__} ({self.tracker.service})"

    def on_start(self, run: RunInfo) -> None:
        self._put(_Record("on_start", run))

    def on_report(self, report: Report) -> None:
        self._put(_Record("on_report", report))

    def on_end(self, result: Result) -> None:
        self._put(_Record("on_end", result))

    def on_group_start(self, group: GroupInfo) -> None:
        self._in_place(self.tracker.on_group_start, group)

    def on_group_end(self, group: GroupInfo) -> None:
        self._in_place(self.tracker.on_group_end, group)

    def on_failure(self, error: WorkerGroupError, restarting: bool) -> None:
        self._in_place(self.tracker.on_failure, error, restarting)

    def _in_place(self, method: Callable[..., None], *arguments: Any) -> None:
        try:
            method(*arguments)
        except Exception as error:
            name = method.__name__
            logger.warning("%s: %s failed (%s); training goes on", self._name, name, error)

    def _put(self, record: _Record) -> None:
        with self._changed:
            self._queue.append(record)
            if self._thread is None:  # in the run's context (e.g. a Prefect task run's)
                self._thread = threading.Thread(
                    target=contextvars.copy_context().run,
                    args=(self._deliver_all,),
                    daemon=True,
                    name=f"delivery-{self.tracker.service}",
                )
                self._thread.start()
            self._changed.notify_all()

    @property
    def waiting(self) -> int:
        """Records not delivered yet (the one being delivered included)."""
        with self._changed:
            return len(self._queue)

    def deadline(self) -> float | None:
        """When the run's end stops waiting: ``outage_tolerance_s`` after the head record's
        first try began (None while nothing is being delivered)."""
        with self._changed:
            if not self._queue or self._head_since is None:
                return None
            return self._head_since + self.tracker.outage_tolerance_s

    def wait(self) -> None:
        """Wait until every queued record is delivered, or the tolerance of an outage is used
        up (then warn which records are left)."""
        with self._changed:
            while self._queue:
                if self._head_since is not None:
                    left = self._head_since + self.tracker.outage_tolerance_s - self._clock()
                    if left <= 0:
                        break
                    self._changed.wait(min(left, 1.0))
                else:
                    self._changed.wait(1.0)
            if not self._queue:
                return
            left_over = ", ".join(record.describe() for record in self._queue)
            outage = self._clock() - (self._head_since or self._clock())
        logger.warning(
            "%s has not answered for %.0f s (outage_tolerance_s=%g): the run ends without "
            "waiting for %s; they are still retried while this process runs",
            self._name,
            outage,
            self.tracker.outage_tolerance_s,
            left_over,
        )

    def _deliver_all(self) -> None:
        while True:
            with self._changed:
                while not self._queue:
                    self._changed.wait()
                record = self._queue[0]
                if self._head_since is None:
                    self._head_since = self._clock()
            delivered = self._deliver(record)
            with self._changed:
                self._queue.popleft()
                self._head_since = None
                if delivered and self._outage_since is not None:
                    logger.warning(
                        "%s answers again after %.0f s; delivering the %d records that waited",
                        self._name,
                        self._clock() - self._outage_since,
                        len(self._queue) + 1,
                    )
                    self._outage_since = None
                    self._told_past_bound = False
                self._changed.notify_all()
                if record.method == "on_end" and not self._queue:
                    self._thread = None  # the run's last record: a later one starts a thread
                    return

    def _deliver(self, record: _Record) -> bool:
        """Deliver one record, retrying through an outage; False if it was dropped."""
        delay = FIRST_RETRY_S
        while True:
            try:
                getattr(self.tracker, record.method)(record.argument)
                return True
            except Exception as error:
                if not self.tracker.is_transient(error):
                    logger.warning(
                        "%s refused %s, which is dropped: %s: %s",
                        self._name,
                        record.describe(),
                        type(error).__name__,
                        error,
                    )
                    return False
                self._note_outage(error)
            time.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)

    def _note_outage(self, error: Exception) -> None:
        now = self._clock()
        with self._changed:
            waiting = len(self._queue)
            if self._outage_since is None:
                self._outage_since = self._head_since if self._head_since is not None else now
                logger.warning(
                    "%s is out of reach (%s: %s): training goes on; %d records wait and are "
                    "retried until it answers",
                    self._name,
                    type(error).__name__,
                    str(error)[:300],
                    waiting,
                )
            elif (
                not self._told_past_bound
                and now - self._outage_since > self.tracker.outage_tolerance_s
            ):
                self._told_past_bound = True
                logger.warning(
                    "%s has been out of reach for over %g s (outage_tolerance_s): training goes "
                    "on; %d records wait, and the run's end will not wait for them",
                    self._name,
                    self.tracker.outage_tolerance_s,
                    waiting,
                )


def with_delivery(callbacks: Sequence[Callback]) -> tuple[Callback, ...]:
    """The run's callbacks as it calls them: each ``TrackingCallback`` behind its
    ``Delivery``."""
    return tuple(Delivery(c) if isinstance(c, TrackingCallback) else c for c in callbacks)


def end_run(callbacks: Sequence[Callback], result: Result) -> None:
    """Tell every callback the run ended (in order; a deciding callback's error is raised
    after the others were told), then wait for the trackers' deliveries."""
    error: Exception | None = None
    for callback in callbacks:
        try:
            callback.on_end(result)
        except Exception as exc:
            error = error or exc
    for callback in callbacks:
        if isinstance(callback, Delivery):
            callback.wait()
    if error is not None:
        raise error
