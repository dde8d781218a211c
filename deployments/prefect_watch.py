"""What the sentinel reads from the Prefect server, and the events it posts there.

Times are the server's: when it received an event (``received``), never the sentinel's clock.
Reads that may return more than a page (the pool's live runs) are read page by page.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.events import Event
from prefect.events.clients import get_events_client
from prefect.events.filters import (
    EventFilter,
    EventIDFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventResourceFilter,
)
from prefect.settings import get_current_settings

ROUND_EVENT = "cifar.sentinel.round"
PAGE = 200  # the Prefect server's largest page of flow runs and deployments


def readiness() -> str | None:
    """Why the Prefect server at ``PREFECT_API_URL`` is not ready (it does not answer, or
    cannot reach its database), or None when it is. One try, no retries: a round's view."""
    api = get_current_settings().api
    verify: bool | ssl.SSLContext = not api.tls_insecure_skip_verify
    if verify and api.ssl_cert_file:
        verify = ssl.create_default_context(cafile=api.ssl_cert_file)
    try:
        response = httpx.get(f"{api.url}/ready", timeout=10, verify=verify)
    except httpx.HTTPError as error:
        return f"the API does not answer ({type(error).__name__})"
    if response.status_code == 503:
        return "it answers but cannot reach its database (/api/ready: 503)"
    if response.status_code != 200:
        return f"/api/ready answers {response.status_code}"
    return None


def post_round(event_id: uuid.UUID) -> None:
    """Post the sentinel's event of a round (``ROUND_EVENT``) with ``event_id``."""
    resource = {"prefect.resource.id": "cifar.sentinel", "prefect.resource.name": "sentinel"}
    event = Event(event=ROUND_EVENT, resource=resource, id=event_id)  # type: ignore[arg-type]
    asyncio.run(_emit(event))


async def _emit(event: Event) -> None:
    async with get_events_client(reconnection_attempts=0) as events:
        await events.emit(event)


def stored_at(client: Any, ids: list[uuid.UUID], now: float) -> dict[uuid.UUID, float]:
    """When the server received each of the events ``ids`` that it stored."""
    page = client.read_events(
        EventFilter(id=EventIDFilter(id=ids), occurred=_wide(now)), limit=len(ids)
    )
    return {event.id: event.received.timestamp() for event in page.events}


def last_heartbeat(client: Any, flow_run_id: Any, now: float) -> float | None:
    """When the server received the run's last heartbeat (None: never)."""
    page = client.read_events(
        EventFilter(
            event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
            occurred=_wide(now),
        ),
        limit=1,
    )
    return page.events[0].received.timestamp() if page.events else None


def _wide(now: float) -> EventOccurredFilter:
    """Occurred within two days of ``now`` either way: no host's clock cuts events off."""
    moment = datetime.fromtimestamp(now, timezone.utc)
    return EventOccurredFilter(
        since=moment - timedelta(days=2),  # type: ignore[arg-type]
        until=moment + timedelta(days=2),  # type: ignore[arg-type]
    )


def live_runs(client: Any, pool: str) -> list[Any]:
    """Every Running or Pending flow run of ``pool``, page by page."""
    found: list[Any] = []
    while True:
        page = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
                )
            ),
            work_pool_filter=_pool(pool),
            sort=FlowRunSort.ID_DESC,
            limit=PAGE,
            offset=len(found),
        )
        found += page
        if len(page) < PAGE:
            return found


def scheduled(client: Any, pool: str) -> list[Any]:
    """The deployments of ``pool`` that are not paused and have an active schedule."""
    found: list[Any] = []
    while True:
        page = client.read_deployments(work_pool_filter=_pool(pool), limit=PAGE, offset=len(found))
        found += page
        if len(page) < PAGE:
            return [d for d in found if not d.paused and any(s.active for s in d.schedules)]


def last_completed(client: Any, deployment: Any) -> tuple[float | None, float]:
    """When the deployment's last completed run ended (None: never) and how long it took."""
    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))
        ),
        sort=FlowRunSort.END_TIME_DESC,
        limit=1,
    )
    if not runs or runs[0].end_time is None:
        return None, 0.0
    ended, started = runs[0].end_time.timestamp(), runs[0].start_time
    return ended, ended - (started.timestamp() if started else ended)


def full_name(client: Any, deployment: Any) -> str:
    """``flow/deployment``, as ``prefect deployment run`` takes it."""
    return f"{client.read_flow(deployment.flow_id).name}/{deployment.name}"


def _pool(name: str) -> WorkPoolFilter:
    return WorkPoolFilter(name=WorkPoolFilterName(any_=[name]))
