"""Other flow runs, as the Prefect API knows them: has one ended?"""

from __future__ import annotations

from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run


def ended(flow_run_id: str) -> bool:
    """Whether flow run ``flow_run_id`` has ended (a final state), or is unknown to this
    server (another server's, or no id at all); never this run itself."""
    if flow_run_id == flow_run.get_id():
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(flow_run_id)).state
    except (ObjectNotFound, ValueError):
        return True
    return state is None or state.is_final()
