"""A run that fails soon after a restart of the Prefect server is alerted at once: its Failed
event follows a state change the server saw before the restart, which Prefect's own ordering
waits 15 minutes for (deployments/event_ordering.py, the setting of every server here and of
the stack's)."""

from __future__ import annotations

import asyncio
import queue
import time
from datetime import timedelta
from pathlib import Path

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Failed, Running

from deployments.alerts import block_id, webhook_block
from tests.deployments.conftest import Webhook
from tests.postgres_rig import Postgres
from tests.prefect_stack import PrefectServer, prefect_environment

ALERT_WITHIN_S = 90.0  # Prefect's ordering held it back for 15 minutes


@flow(name="ordering-probe")
def _probe() -> None:
    """Never run: its runs' states are set by the test."""


def test_a_run_failing_just_after_a_server_restart_is_alerted_at_once(
    postgres: Postgres, webhook: Webhook, tmp_path: Path
) -> None:
    env = prefect_environment(tmp_path, postgres.create_database("ordering"))
    assert env["PREFECT_SERVER_EVENTS_CAUSAL_ORDERING"] == "deployments.event_ordering"
    server = PrefectServer(env, tmp_path / "server.log")
    server.start()
    try:
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            webhook_block("custom-webhook/ordering", webhook.url)

            block = asyncio.run(block_id("custom-webhook/ordering"))
            assert block is not None
            with get_client(sync_client=True) as client:
                client.create_automation(
                    AutomationCore(
                        name="run-failed",
                        trigger=EventTrigger(
                            match={"prefect.resource.id": "prefect.flow-run.*"},
                            expect={"prefect.flow-run.Failed"},
                            for_each={"prefect.resource.id"},
                            posture=Posture.Reactive,
                            threshold=1,
                            within=timedelta(0),
                        ),
                        actions=[
                            SendNotification(
                                block_document_id=block,
                                subject="run {{ flow_run.name }} {{ flow_run.state.name }}",
                                body="{{ flow_run.state.message }}",
                            )
                        ],
                    )
                )
                run = client.create_flow_run(_probe)
                client.set_flow_run_state(run.id, Running(), force=True)
            server.stop()  # the server restarts less than five minutes after Running
            server.start()
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run.id, Failed(message="a rank died"), force=True)
                failed_at = time.monotonic()
            subjects = []
            while time.monotonic() - failed_at < ALERT_WITHIN_S:
                try:
                    subjects.append(webhook.received.get(timeout=1)["subject"])
                except queue.Empty:
                    continue
                if f"run {run.name} Failed" in subjects:
                    break
            assert subjects == [f"run {run.name} Failed"]
    finally:
        server.stop()
