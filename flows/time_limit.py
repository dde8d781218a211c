"""A flow run's time limit: a run that takes longer fails, naming its limit, and stops its work.

Each flow takes ``timeout_minutes`` (a deployment sets its own: docs/mlops.md, "On call"). When
the time is up, the flow's code is interrupted: a training in flight is stopped the way Ctrl-C
stops it (trainlib's driver loop, at a point of its own, stops every rank and raises), other
code at once; the Dask client of the run closes, and the flow run ends ``Failed`` with
:class:`TimeLimitExceeded`, which frees its concurrency slots for the next run. A run without a
limit (``None``) is never stopped.

Why not an exception raised wherever the main thread is (Prefect's ``timeout``): raised inside
MLflow's SQL store during a training step it left the run's SQLite store locked, so ending the
MLflow run failed with "database is locked" instead of naming the time limit (seen once in a
fresh-clone CI).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from prefect.utilities.timeout import timeout


class TimeLimitExceeded(TimeoutError):
    """A flow run took longer than its ``timeout_minutes``."""


class _Expired(TimeoutError):
    """Raised here only, so that no other TimeoutError is mistaken for it."""


@contextmanager
def time_limit(minutes: float | None, flow_name: str) -> Iterator[None]:
    """Run the block for at most ``minutes``; then raise :class:`TimeLimitExceeded`."""
    if minutes is None:
        yield
        return
    if minutes <= 0:
        raise ValueError(
            f"timeout_minutes must be positive, got {minutes}: give the most minutes a run of "
            f"{flow_name} may take, or none for no limit"
        )
    expired = threading.Event()
    try:
        with _alarm(minutes * 60, expired):
            yield
    except (_Expired, KeyboardInterrupt):
        if not expired.is_set():
            raise  # a real Ctrl-C
        raise TimeLimitExceeded(
            f"{flow_name} ran longer than its time limit, timeout_minutes={minutes:g}, and was "
            "stopped with its training. If runs this long are expected, raise timeout_minutes "
            "(a parameter; each deployment sets its own in deployments/prefect.yaml)."
        ) from None


@contextmanager
def _alarm(seconds: float, expired: threading.Event) -> Iterator[None]:
    """After ``seconds``, set ``expired`` and interrupt the main thread: through its Ctrl-C
    handler when one defers Ctrl-C (a training in flight stops in order), else by raising
    ``_Expired`` there. An enclosing alarm is put back afterwards with the time it had left.
    Off the main thread (no signals), Prefect's thread-based timeout."""
    if threading.current_thread() is not threading.main_thread():
        try:
            with timeout(seconds=seconds, timeout_exc_type=_Expired):
                yield
        except _Expired:
            expired.set()
            raise
        return

    def ring(signum: int, frame: FrameType | None) -> None:
        expired.set()
        on_interrupt = signal.getsignal(signal.SIGINT)
        if callable(on_interrupt) and on_interrupt is not signal.default_int_handler:
            on_interrupt(signal.SIGINT, frame)  # e.g. trainlib's: stop at the next safe point
            return
        raise _Expired

    previous = signal.signal(signal.SIGALRM, ring)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:  # an enclosing alarm (pytest-timeout's, say) rings as it would have
            left = max(outer_delay - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)
