"""A flow run's time limit: a run that takes longer fails, naming its limit, and stops its work.

Each flow takes ``timeout_minutes`` (a deployment sets its own: docs/mlops.md, "On call"). When
the time is up, Prefect's ``timeout`` interrupts the flow's code wherever it waits: a training
stops every rank on the way out (as on Ctrl-C), the Dask client of the run closes, and the flow
run ends ``Failed`` with :class:`TimeLimitExceeded`, which frees its concurrency slots for the
next run. A run without a limit (``None``) is never stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect.utilities.timeout import timeout


class TimeLimitExceeded(TimeoutError):
    """A flow run took longer than its ``timeout_minutes``."""


class _Expired(TimeoutError):
    """Raised by Prefect's timeout here only, so that no other TimeoutError is mistaken for it."""


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
    try:
        with timeout(seconds=minutes * 60, timeout_exc_type=_Expired):
            yield
    except _Expired:
        raise TimeLimitExceeded(
            f"{flow_name} ran longer than its time limit, timeout_minutes={minutes:g}, and was "
            "stopped with its training. If runs this long are expected, raise timeout_minutes "
            "(a parameter; each deployment sets its own in deployments/prefect.yaml)."
        ) from None
