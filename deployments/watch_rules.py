"""The sentinel's rules, as pure functions of what it observed (``deployments/sentinel.py``).

- An **incident** is a condition that must hold for its bound before it is reported, once,
  until it ends.
- A run's **silence** is measured on the Prefect server's clock, and only over time the server
  was storing events: the sentinel posts an event every round and keeps the times the server
  received those that were stored; a gap among them (the database down, events dropped, the
  sentinel stopped) restarts the count, since heartbeats may have been lost in it.
- A scheduled deployment is **overdue** when the run its schedule planned at a fire time has
  had the time the last run took plus a grace, and no run completed since that fire time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Incident:
    """A condition that must hold for ``bound_s`` before it is reported, once, until it ends."""

    bound_s: float
    since: float | None = None
    reported: bool = False

    def observe(self, failing: bool, now: float) -> bool:
        """Record one observation; True exactly once per incident, when it is to be reported."""
        if not failing:
            self.since, self.reported = None, False
            return False
        if self.since is None:
            self.since = now
        if not self.reported and now - self.since >= self.bound_s:
            self.reported = True
            return True
        return False

    def saved(self) -> dict[str, Any]:
        return {"since": self.since, "reported": self.reported}

    def restore(self, saved: dict[str, Any]) -> None:
        self.since, self.reported = saved.get("since"), bool(saved.get("reported"))


def silence(since: float, stored: Sequence[Sequence[Any]], gap_s: float) -> float:
    """How long a run has been silent since ``since`` (its last heartbeat, else when it entered
    its state), counted on the server's clock over ``stored``: the sentinel's stored events in
    the order it posted them, each ``(received, fresh)`` (when the server received it; whether
    the round before it failed to reach a ready server). Counted from the last break after
    ``since`` (a fresh event, a gap longer than ``gap_s``, a server clock that went back) or
    from ``since``, to the newest stored event; nothing stored after ``since``: 0."""
    start = previous = since
    for received, fresh in stored:
        if received <= since:
            continue
        if fresh or received - previous > gap_s or received < previous:
            start = received
        previous = received
    return max(previous - start, 0.0)


def kept(stored: Sequence[Sequence[Any]], span_s: float) -> list[list[Any]]:
    """The stored events that can still matter: from the last one more than ``span_s`` older
    than the newest (which marks where counting may start), in order."""
    if not stored:
        return []
    newest = stored[-1][0]
    first = max((i for i, (t, _) in enumerate(stored) if newest - t > span_s), default=0)
    return [list(s) for s in stored[first:]]


def due(fires: Iterable[float | None], since: float) -> float | None:
    """The latest of ``fires`` (each schedule's last fire time whose run has had its time)
    at or after ``since`` (when the deployment was created); None when there is none yet."""
    return max((f for f in fires if f is not None and f >= since), default=None)


def overdue(due_at: float | None, last_completed: float | None) -> bool:
    """Whether no run completed since the fire time ``due_at`` (None: nothing due yet)."""
    return due_at is not None and (last_completed is None or last_completed < due_at)
