"""When a deployment's schedule fired in the past, worked out as the Prefect server does."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from prefect.server.schemas import schedules as server_schedules
from prefect.server.utilities.schemas.bases import PrefectBaseModel

_KINDS: dict[str, type[PrefectBaseModel]] = {
    "CronSchedule": server_schedules.CronSchedule,
    "IntervalSchedule": server_schedules.IntervalSchedule,
    "RRuleSchedule": server_schedules.RRuleSchedule,
}
_LOOKBACKS_S = (3600.0, 86400.0, 32 * 86400.0, 400 * 86400.0)
_MOST = 1000  # the dates the server's schedules give at most per call


def last_fire(schedule: Any, until: float) -> float | None:
    """The latest fire time of ``schedule`` (a deployment's Cron, Interval or RRule schedule,
    as the client reads it) at or before ``until`` (seconds since the epoch); None when it did
    not fire in the 400 days before."""
    kind = _KINDS[type(schedule).__name__]
    server_side = kind.model_validate(schedule.model_dump())
    end = datetime.fromtimestamp(until, timezone.utc)
    for lookback in _LOOKBACKS_S:
        start = end - timedelta(seconds=lookback)
        dates: list[datetime] = []
        while True:  # a window the server pages by at most _MOST dates
            page = asyncio.run(server_side.get_dates(n=_MOST, start=start, end=end))  # type: ignore[attr-defined]
            dates += page
            if len(page) < _MOST:
                break
            start = page[-1] + timedelta(seconds=1)
        if dates:
            return dates[-1].timestamp()
    return None
