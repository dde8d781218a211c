"""A flow run's heartbeats as Prefect's flow engine sends them, every second, until killed:

    python -m tests.deployments.heartbeats FLOW_RUN_ID

The engine emits ``prefect.flow-run.heartbeat`` with the run as the resource through the
events client every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` (30 s at least); this process sends
the same event every second, so a test of the sentinel needs no 30-second waits. A heartbeat
the server does not take is lost, as the engine's are; the next one is sent on time."""

from __future__ import annotations

import asyncio
import sys

from prefect.events import Event
from prefect.events.clients import get_events_client


async def beat(flow_run_id: str) -> None:
    resource = {"prefect.resource.id": f"prefect.flow-run.{flow_run_id}"}
    while True:
        try:
            async with get_events_client(reconnection_attempts=0) as events:
                await events.emit(Event(event="prefect.flow-run.heartbeat", resource=resource))
        except Exception as error:  # the server restarting: this heartbeat is lost
            print(f"heartbeat lost: {type(error).__name__}", flush=True)
        await asyncio.sleep(1)


if __name__ == "__main__":
    asyncio.run(beat(sys.argv[1]))
