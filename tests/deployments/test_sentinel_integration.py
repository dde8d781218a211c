"""The sentinel as the stack runs it (a process of its own) against a real Prefect server, and
against none: each silence is one message to the webhook."""

from __future__ import annotations

import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.deployments.conftest import Webhook
from tests.helpers import free_port
from tests.prefect_stack import REPO

SENTINEL = (sys.executable, "-m", "deployments.sentinel")


@contextmanager
def sentinel(env: dict[str, str], *options: str) -> Iterator[Path]:
    """The sentinel running with ``options`` (a round every second) until the block ends: its
    log."""
    log = Path(tempfile.mkdtemp(prefix="sentinel-")) / "sentinel.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*SENTINEL, "--interval-s", "1", *options],
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


def test_sentinel_reports_a_prefect_server_that_does_not_answer_once(
    webhook: Webhook, prefect_env: dict[str, str]
) -> None:
    dead = {**prefect_env, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    with sentinel(dead, "--url", webhook.url, "--down-s", "3"):
        messages = _messages(webhook, 15)
    subjects = [m["subject"] for m in messages]
    assert subjects == ["Prefect server unhealthy for 3 s"], subjects
    assert "no alert of the server is sent" in messages[0]["body"]


def test_sentinel_reports_an_overdue_nightly_and_a_failing_service_once(
    webhook: Webhook, deployed: dict[str, str]
) -> None:
    dead_service = f"http://127.0.0.1:{free_port()}/health"
    options = ["--url", webhook.url, "--nightly-within-h", "0.001", "--down-s", "2"]
    with sentinel(deployed, *options, "--check", f"mlflow={dead_service}"):
        messages = _messages(webhook, 20)
    subjects = sorted(m["subject"] for m in messages)
    assert subjects == [
        "service mlflow: unhealthy for 2 s",
        "train-cifar/nightly: no run completed in 0.001 h",
    ], subjects
