"""The alerts of deployments/automations.yaml under concurrent load: every failed scheduled run
is notified, none is lost (on SQLite, Prefect's trigger service dead-letters an event when a
write is refused, and its alert never comes: the server runs on PostgreSQL)."""

from __future__ import annotations

import queue
import subprocess
import time
from typing import Any

import pytest

from tests.deployments.conftest import ALERTS_COMMAND, Webhook
from tests.prefect_stack import REPO

RUNS = 10
NOTIFY_WITHIN_S = 180.0  # on PostgreSQL all ten come within a minute, also on a loaded machine


def _crash_at_once(deployment: str, count: int) -> list[str]:
    """``count`` runs of ``deployment`` started at once, each crashing as soon as the worker
    starts it (its command is ``false``, not the flow): a night of failures without ten flow
    processes on 2 cores. The deployment's concurrency limit queues them, as it queues
    nightlies; their names."""
    from prefect.deployments import run_deployment

    runs = [
        run_deployment(deployment, job_variables={"command": "false"}, timeout=0)
        for _ in range(count)
    ]
    return [run.name for run in runs]


def _notified(webhook: Webhook, names: list[str]) -> dict[str, dict[str, Any]]:
    """Run name → its notification, for each notification received within the bound."""
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + NOTIFY_WITHIN_S
    while len(found) < len(names) and (left := deadline - time.monotonic()) > 0:
        try:
            message = webhook.received.get(timeout=left)  # the server's automation posts it
        except queue.Empty:
            break
        found |= {name: message for name in names if f"run {name} " in message["subject"]}
    return found


@pytest.mark.timeout(600)
def test_alerts_ten_nightlies_crashing_at_once_send_ten_notifications(
    deployed: dict[str, str], webhook: Webhook
) -> None:
    subprocess.run(
        [*ALERTS_COMMAND, "--block", "custom-webhook/cifar-alerts", "--url", webhook.url],
        env=deployed,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    names = _crash_at_once("train-cifar/nightly", RUNS)
    notified = _notified(webhook, names)
    assert sorted(notified) == sorted(names)
    for name, message in notified.items():
        assert message["subject"] == f"train-cifar/nightly: run {name} Crashed"
        assert "ended Crashed" in message["body"]
