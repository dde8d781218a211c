"""Fixtures of the deployment tests: the deployments registered on the session's Prefect
server, and a local webhook that receives the server's notifications."""

from __future__ import annotations

import json
import queue
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.helpers import http_server
from tests.prefect_stack import deploy_all

ALERTS_COMMAND = (sys.executable, "-m", "deployments.alerts")  # as docs/mlops.md says


@pytest.fixture(scope="module")
def deployed(prefect_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Every deployment of deployments/prefect.yaml registered (as the README says), this
    process's client pointed at the server."""
    deploy_all(prefect_env)
    with temporary_settings({PREFECT_API_URL: prefect_env["PREFECT_API_URL"]}):
        yield prefect_env


@dataclass
class Webhook:
    """A local HTTP server receiving notifications: every POSTed JSON body, in order; and a
    dead-man's switch: the path of every GET (a ping) at ``ping_url``."""

    url: str
    received: queue.Queue[dict[str, Any]]
    pings: queue.Queue[str]

    @property
    def ping_url(self) -> str:
        return self.url.replace("/hook", "/ping/a-secret-token")


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    received: queue.Queue[dict[str, Any]] = queue.Queue()
    pings: queue.Queue[str] = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pings.put(self.path)
            self.send_response(200)
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            received.put(json.loads(self.rfile.read(length) or b"{}"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with http_server(Handler) as url:
        yield Webhook(f"{url}/hook", received, pings)
