"""The sentinel through a PostgreSQL outage and a clock step, against a Prefect server on its
own PostgreSQL (stopped and started here): one alert for the outage, no live run marked
Crashed, and dead runs still found before and after."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Running

from deployments.sentinel import Sentinel, SentinelConfig
from tests.deployments.conftest import Webhook
from tests.deployments.test_sentinel_integration import _messages, sentinel
from tests.postgres_rig import Postgres, postgres_server
from tests.postgres_rig import unavailable_reason as postgres_unavailable
from tests.prefect_stack import REPO, PrefectServer, create_pool, prefect_environment

POOL = "watched"
BOUNDS = ("--zombie-s", "4", "--down-s", "3", "--pool", POOL)
DEADLINE_S = 90.0


@dataclass
class Watched:
    postgres: Postgres
    env: dict[str, str]
    deployment: Any


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    """A Prefect server on a PostgreSQL of its own, a pool ``watched`` and a deployment in it."""
    if (reason := postgres_unavailable()) is not None:
        pytest.fail(reason)
    home = tmp_path_factory.mktemp("watched-prefect")
    with postgres_server() as postgres:
        env = prefect_environment(home, postgres.create_database("prefect"))
        server = PrefectServer(env, home / "server.log")
        server.start()
        try:
            create_pool(env, POOL)
            with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
                with get_client(sync_client=True) as client:
                    flow_id = client.create_flow_from_name("watched")
                    deployment = client.create_deployment(
                        flow_id=flow_id, name="d", work_pool_name=POOL, entrypoint="f.py:f"
                    )
                yield Watched(postgres, env, deployment)
        finally:
            server.stop()


def _running(watched: Watched) -> uuid.UUID:
    """A new flow run of the pool, Running (as the worker leaves it when its process starts)."""
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(watched.deployment)
        client.set_flow_run_state(run.id, Running(), force=True)
    return run.id


def _state(run_id: uuid.UUID) -> str:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state.type.value  # type: ignore[union-attr]


def _until_crashed(run_id: uuid.UUID) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while _state(run_id) != "CRASHED":
        assert time.monotonic() < deadline, f"{run_id} not marked Crashed in {DEADLINE_S} s"
        time.sleep(0.5)


@contextmanager
def _beating(watched: Watched, run_id: uuid.UUID) -> Iterator[None]:
    """``run_id``'s heartbeats, every second, from a process of their own."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.deployments.heartbeats", str(run_id)],
        env=watched.env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def client_of(watched: Watched) -> Iterator[None]:
    with temporary_settings({PREFECT_API_URL: watched.env["PREFECT_API_URL"]}):
        yield


@pytest.mark.usefixtures("client_of")
def test_sentinel_a_database_outage_is_one_alert_and_crashes_no_live_run(
    watched: Watched, webhook: Webhook, tmp_path: Path
) -> None:
    _messages(webhook, 0)
    live = _running(watched)
    options = ("--url", webhook.url, *BOUNDS, "--state", str(tmp_path / "state.json"))
    with _beating(watched, live), sentinel(watched.env, *options):
        _until_crashed(_running(watched))  # it judges: a run without heartbeats is found
        watched.postgres.stop()
        try:
            during = [m["subject"] for m in _messages(webhook, 10)]
        finally:
            watched.postgres.start()
        _until_crashed(_running(watched))  # judging again after the outage
        after = [m["subject"] for m in _messages(webhook, 5)]
        assert _state(live) == "RUNNING"
    assert during == ["Prefect server not ready for 3 s"], during
    assert after == [], after


@pytest.mark.usefixtures("client_of")
def test_sentinel_a_clock_step_of_its_host_crashes_no_live_run(
    watched: Watched, webhook: Webhook, tmp_path: Path
) -> None:
    """The sentinel's clock jumps 5 minutes ahead (then back) between rounds; silence is
    counted on the server's clock, so the live run stays Running; a dead one is still found."""
    _messages(webhook, 0)
    live, step = _running(watched), [0.0]
    config = SentinelConfig(
        webhook_url=webhook.url, pool=POOL, zombie_s=4, down_s=3, interval_s=1,
        state_path=tmp_path / "state.json",
    )  # fmt: skip
    watcher = Sentinel(config, clock=lambda: time.time() + step[0])
    with _beating(watched, live):
        dead = _running(watched)
        deadline = time.monotonic() + DEADLINE_S
        rounds = 0
        while _state(dead) != "CRASHED":
            assert time.monotonic() < deadline, "the dead run was not found"
            rounds += 1
            step[0] = 300.0 if rounds % 4 < 2 else 0.0  # ahead for two rounds, back for two
            watcher.round()
            assert _state(live) == "RUNNING", f"marked Crashed at round {rounds}"
            time.sleep(1)
    assert rounds > 4  # the step was taken, forth and back
    assert [m["subject"] for m in _messages(webhook, 0)] == []
