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

import httpx
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.events import Event
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Failed, Running

from deployments.alerts import block_id, webhook_block
from tests.deployments.conftest import Webhook
from tests.postgres_rig import Postgres
from tests.prefect_stack import PrefectServer, prefect_environment

ALERT_WITHIN_S = 90.0  # Prefect's ordering held it back for 15 minutes
RUN_SUBJECT = "run {{ flow_run.name }} {{ flow_run.state.name }}"


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
                for name, match, expect, subject in (
                    ("run-failed", "prefect.flow-run.*", "prefect.flow-run.Failed", RUN_SUBJECT),
                    ("probe", "probe.*", "probe.ping", "probe"),
                ):
                    client.create_automation(
                        AutomationCore(
                            name=name,
                            trigger=EventTrigger(
                                match={"prefect.resource.id": match},
                                expect={expect},
                                for_each={"prefect.resource.id"},
                                posture=Posture.Reactive,
                                threshold=1,
                                within=timedelta(0),
                            ),
                            actions=[
                                SendNotification(
                                    block_document_id=block,
                                    subject=subject,
                                    body="{{ event.event }}",
                                )
                            ],
                        )
                    )
                run = client.create_flow_run(_probe)
                client.set_flow_run_state(run.id, Running(), force=True)
            server.stop()  # the server restarts less than five minutes after Running
            server.start()
            # Prefect's in-memory messaging delivers an event only to the consumers subscribed
            # when it is published: the run fails once a probe event has reached the webhook
            # (the automations consume), so the ordering alone is tested here.
            _until_automations_consume(env["PREFECT_API_URL"], webhook)
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run.id, Failed(message="a rank died"), force=True)
                failed_at = time.monotonic()
            subjects = []
            while time.monotonic() - failed_at < ALERT_WITHIN_S:
                try:
                    subject = webhook.received.get(timeout=1)["subject"]
                except queue.Empty:
                    continue
                if subject != "probe":  # a late answer to an earlier probe
                    subjects.append(subject)
                if f"run {run.name} Failed" in subjects:
                    break
            assert subjects == [f"run {run.name} Failed"]
    finally:
        server.stop()


def _until_automations_consume(api_url: str, webhook: Webhook) -> None:
    """Send probe events, one a second, until the probe automation's notification arrives."""
    deadline = time.monotonic() + ALERT_WITHIN_S
    while time.monotonic() < deadline:
        probe = Event(event="probe.ping", resource={"prefect.resource.id": "probe.ordering"})
        httpx.post(f"{api_url}/events", json=[probe.model_dump(mode="json")]).raise_for_status()
        try:
            if webhook.received.get(timeout=1)["subject"] == "probe":
                return
        except queue.Empty:
            continue
    raise AssertionError(f"no probe event reached the webhook within {ALERT_WITHIN_S} s")
