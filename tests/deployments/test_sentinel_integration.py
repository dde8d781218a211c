"""The sentinel as the stack runs it (a process of its own) against a real Prefect server, and
against none: each silence is one message to the webhook."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.schedules import IntervalSchedule
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Completed

from tests.deployments.conftest import Webhook
from tests.helpers import free_port
from tests.prefect_stack import REPO, create_pool

SENTINEL = (sys.executable, "-m", "deployments.sentinel")


@contextmanager
def sentinel(env: dict[str, str], *options: str) -> Iterator[Path]:
    """The sentinel running with ``options`` (a round every second; its state in a new folder
    unless ``--state`` is among them) until the block ends: its log."""
    log = Path(tempfile.mkdtemp(prefix="sentinel-")) / "sentinel.log"
    state = [] if "--state" in options else ["--state", str(log.with_name("state.json"))]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*SENTINEL, "--interval-s", "1", *state, *options],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield log
    finally:
        process.terminate()
        process.wait(timeout=30)


def _messages(webhook: Webhook, within_s: float) -> list[dict[str, Any]]:
    """Every message received within ``within_s``."""
    found, deadline = [], time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            found.append(webhook.received.get(timeout=left))
        except queue.Empty:
            break
    return found


def test_sentinel_reports_a_prefect_server_that_never_answers_once_across_a_restart(
    webhook: Webhook, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    """Started while Prefect does not answer, restarted mid-incident: one message, whose
    incident began at the first start (the state kept), pings to the dead-man's switch all
    along, and a healthcheck that passes once rounds run."""
    _messages(webhook, 0)
    while not webhook.pings.empty():
        webhook.pings.get()
    dead = {**prefect_env, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    state = tmp_path / "state.json"
    options = ("--url", webhook.url, "--down-s", "6", "--state", str(state))
    healthcheck = [*SENTINEL, "--healthcheck", "--state", str(state)]
    assert subprocess.run(healthcheck, env=dead, cwd=REPO, capture_output=True).returncode == 1
    with sentinel(dead, *options, "--heartbeat-url", webhook.ping_url):
        early = _messages(webhook, 3)
    began = json.loads(state.read_text())["incidents"]["prefect"]["since"]
    with sentinel(dead, *options):
        messages = early + _messages(webhook, 12)
        checked = subprocess.run(healthcheck, env=dead, cwd=REPO, capture_output=True)
    subjects = [m["subject"] for m in messages]
    assert subjects == ["Prefect server not ready for 6 s"], subjects
    assert "the API does not answer" in messages[0]["body"]
    assert json.loads(state.read_text())["incidents"]["prefect"]["since"] == began
    assert checked.returncode == 0, checked.stderr
    assert webhook.pings.get(timeout=1) == "/ping/a-secret-token"


def test_sentinel_reports_an_overdue_schedule_and_a_failing_service_once_per_incident(
    webhook: Webhook, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    """A deployment scheduled every 2 s in a pool no worker serves: overdue once, until a run
    completes; then overdue again, once (a new incident)."""
    _messages(webhook, 0)
    create_pool(prefect_env, "sentinel-overdue")
    with (
        temporary_settings({PREFECT_API_URL: prefect_env["PREFECT_API_URL"]}),
        get_client(sync_client=True) as client,
    ):
        flow_id = client.create_flow_from_name("overdue")
        deployment = client.create_deployment(
            flow_id=flow_id,
            name="every-2s",
            work_pool_name="sentinel-overdue",
            entrypoint="f.py:f",
            schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(interval=2))],
        )
        try:
            dead_service = f"http://127.0.0.1:{free_port()}/health"
            options = ["--url", webhook.url, "--grace-h", "0.001", "--down-s", "2"]
            options += ["--pool", "sentinel-overdue", "--state", str(tmp_path / "s.json")]
            with sentinel(prefect_env, *options, "--check", f"mlflow={dead_service}"):
                first = _messages(webhook, 15)
                run = client.create_flow_run_from_deployment(deployment)
                client.set_flow_run_state(run.id, Completed(), force=True)
                second = _messages(webhook, 15)
        finally:
            client.delete_deployment(deployment)
    prefix = "overdue/every-2s: no run completed since the one due at "
    subjects = sorted(m["subject"] for m in first)
    assert len(subjects) == 2 and subjects[1] == "service mlflow: unhealthy for 2 s", subjects
    assert subjects[0].startswith(prefix), subjects
    again = [m["subject"] for m in second]
    assert len(again) == 1 and again[0].startswith(prefix), again
    due_again = datetime.fromisoformat(again[0].removeprefix(prefix))
    assert due_again > datetime.fromisoformat(subjects[0].removeprefix(prefix))
