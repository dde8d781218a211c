"""The stack's alerts as a new operator gets them from `make stack-up-local` (podman-compose,
every variable of docker/.env.example set): every automation of deployments/automations.yaml
applied with its notification, read back from the server, and a run failed on purpose alerted
once at the webhook (tests/containers/compose.alerts.yml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from deployments.alerts import AUTOMATIONS, specs
from tests.containers.stack import (
    MODEL,
    Stack,
    alerts_received,
    first_alert,
    run_deployment,
)

ALERT_WITHIN_S = 180.0  # the server's automation posts it within a minute on 2 cores

_READ_AUTOMATIONS = """
import asyncio, json
from prefect.client.orchestration import get_client

async def main():
    async with get_client() as client:
        block = await client.read_block_document_by_name("cifar-alerts", "custom-webhook")
        found = [
            {"name": a.name, "enabled": a.enabled,
             "notify": [str(x.block_document_id) for x in a.actions
                        if x.type == "send-notification"]}
            for a in await client.read_automations()
        ]
    print(json.dumps({"block": str(block.id), "automations": found}))

asyncio.run(main())
"""


def _server_automations(stack: Stack) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _READ_AUTOMATIONS],
        env={**os.environ, **stack.prefect_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    read: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return read


def test_every_automation_is_applied_with_its_notification(stack: Stack) -> None:
    read = _server_automations(stack)
    applied = {a["name"]: a for a in read["automations"]}
    assert set(applied) == {spec["name"] for spec in specs(AUTOMATIONS)}
    for name, automation in applied.items():
        assert automation["enabled"], name
        assert automation["notify"] == [read["block"]], name


def test_a_run_failed_on_purpose_is_alerted_once_at_the_webhook(stack: Stack) -> None:
    run = run_deployment(
        stack,
        "train-cifar/manual",
        {"registered_model_name": MODEL, "data_url": "s3://cifar/inputs/no-such.tar.gz"},
    )
    assert run["state"] == "FAILED", run

    def about_the_run(alert: dict[str, Any]) -> bool:
        return f"Flow run id: {run['id']}" in str(alert.get("body"))

    alert = first_alert(about_the_run, ALERT_WITHIN_S)
    assert "train-cifar/manual: run " in alert["subject"]
    assert alert["subject"].endswith(" Failed")
    assert "no-such.tar.gz" in alert["body"]
    assert [a for a in alerts_received() if about_the_run(a)] == [alert]  # once
