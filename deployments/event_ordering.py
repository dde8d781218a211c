"""The order in which the Prefect server's automations see events, kept across its restarts.

    PREFECT_SERVER_EVENTS_CAUSAL_ORDERING=deployments.event_ordering   # the server's setting

A flow run's state event names the one before it (``follows``) when the two are under five
minutes apart, and Prefect's automations hold an event back until they have seen the one it
follows. What they have seen lives in the server's memory (Prefect's ``memory`` and ``db``
orderings alike): after a restart, a run that failed within five minutes of its last state
change before the restart had its ``Failed`` event held back for the full 15-minute lookback,
and its alert came 15 minutes late. Here an event that follows one the server recorded before
this server process started goes through at once: that one was either seen by the server
before the restart or is lost with it, and waiting cannot bring it back. Every other event is
ordered as Prefect orders it. (Prefect's in-memory messaging delivers an event only to the
consumers subscribed when it is published: one a restarted server received before its
automations subscribed would reach no ordering at all.)
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import ClassVar
from uuid import UUID

import sqlalchemy as sa
from prefect.server.database import provide_database_interface
from prefect.server.events.ordering import memory
from prefect.server.events.schemas.events import ReceivedEvent

# When this server process first ordered an event (Prefect imports the ordering when its
# automations start): the process's create time would do, but psutil derives it from the boot
# time in whole seconds, and a state set a fraction of a second before a restart then counted
# as after it (seen: the Failed event of such a run waited the full 15 minutes).
STARTED = datetime.now(timezone.utc)


class CausalOrdering(memory.CausalOrdering):
    """Prefect's in-memory ordering, letting through what follows an event from before the
    process started."""

    _instances: ClassVar[dict[str, memory.CausalOrdering]] = {}  # its own, not Prefect's
    _locks: ClassVar[dict[str, asyncio.Lock]] = {}

    async def wait_for_leader(self, event: ReceivedEvent) -> None:
        leader = event.follows
        if (
            leader is not None
            and leader != event.id
            and not await self.event_has_been_seen(leader)
            and await recorded_before_start(leader)
        ):
            return
        await super().wait_for_leader(event)


async def recorded_before_start(event_id: UUID) -> bool:
    """Whether the server recorded event ``event_id`` (an event, or the flow run state whose
    event it is) before this process started."""
    db = provide_database_interface()
    try:
        async with db.session_context() as session:
            received = await session.scalar(
                sa.select(db.Event.received).where(db.Event.id == event_id)
            )
            if received is None:  # events are stored in batches: the state is stored at once
                received = await session.scalar(
                    sa.select(db.FlowRunState.timestamp).where(db.FlowRunState.id == event_id)
                )
    except (sa.exc.SQLAlchemyError, OSError):  # the database out of reach: Prefect's order
        return False
    if received is None:
        return False
    if received.tzinfo is None:
        received = received.replace(tzinfo=timezone.utc)
    return bool(received < STARTED)
