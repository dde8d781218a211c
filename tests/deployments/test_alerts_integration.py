"""The automations of deployments/automations.yaml on a real Prefect server (on PostgreSQL)
with real workers: every failed or crashed scheduled run is notified, also ten at once; a run
whose worker died is marked Crashed by its missing heartbeats, alerted, and the next nightly
runs; a run no worker starts, and a work pool without a worker, are alerted; triggers match the
deployments by id."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment

from cifar.format import write_synthetic_archive
from tests.conftest import HttpDir
from tests.deployments.conftest import ALERTS_COMMAND, Webhook
from tests.deployments.test_sentinel_integration import sentinel
from tests.lossy_proxy import lossy_proxy
from tests.prefect_records import final_flow_runs, flow_run_logs
from tests.prefect_stack import REPO, WORKER_PID, start_worker

RUNS = 10
NOTIFY_WITHIN_S = 180.0  # on PostgreSQL all ten come within a minute, also on a loaded machine
LATE_WITHIN_S = 20  # the test's bound for cifar-run-late (15 minutes in production)
ZOMBIE_WITHIN_S = 300.0  # heartbeats every 30 s, Crashed after 90 s without one
ALL_DEPLOYMENTS = (
    "train-cifar/manual",
    "train-cifar/nightly",
    "tune-cifar/weekly",
    "predict-cifar/champion",
    "sweep-storage/daily",
)


def _apply_alerts(env: dict[str, str], webhook: Webhook) -> None:
    """The automations applied as the deploy step applies them, notifying the webhook."""
    done = subprocess.run(
        [*ALERTS_COMMAND, "--url", webhook.url, "--within", f"cifar-run-late={LATE_WITHIN_S}"],
        env={**env, "CIFAR_ALERTS_BLOCK": "custom-webhook/cifar-alerts"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def alerts(deployed: dict[str, str], webhook: Webhook) -> dict[str, str]:
    """The automations applied as the deploy step applies them, notifying the webhook."""
    _apply_alerts(deployed, webhook)
    return deployed


def _notified(webhook: Webhook, keys: dict[str, str], within: float) -> dict[str, dict[str, Any]]:
    """Key → its notification, the first whose subject holds ``keys[key]``, for each received
    within the bound."""
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + within
    while len(found) < len(keys) and (left := deadline - time.monotonic()) > 0:
        try:
            message = webhook.received.get(timeout=left)  # the server's automation posts it
        except queue.Empty:
            break
        found |= {k: message for k, part in keys.items() if part in message["subject"]}
    return found


def _runs(*names: str) -> dict[str, str]:
    return {name: f"run {name} " for name in names}


def test_alerts_match_the_deployments_by_id(alerts: dict[str, str]) -> None:
    async def read() -> tuple[dict[str, Any], dict[str, str]]:
        async with get_client() as client:
            automations = {a.name: a for a in await client.read_automations()}
            ids = {
                name: f"prefect.deployment.{(await client.read_deployment_by_name(name)).id}"
                for name in ALL_DEPLOYMENTS
            }
        return automations, ids

    automations, ids = asyncio.run(read())
    failed = automations["cifar-run-failed"].trigger.match_related
    assert failed.model_dump() == {
        "prefect.resource.role": "deployment",
        "prefect.resource.id": [ids[name] for name in ALL_DEPLOYMENTS],
    }
    assert {
        "cifar-run-failed",
        "cifar-run-late",
        "cifar-pool-offline",
        "cifar-nightly-running-too-long",
        "cifar-weekly-running-too-long",
    } <= set(automations)


def test_alerts_without_a_block_or_url_fail_naming_it_and_change_nothing(
    alerts: dict[str, str],
) -> None:
    async def automation_ids() -> set[str]:
        async with get_client() as client:
            return {str(a.id) for a in await client.read_automations()}

    before = asyncio.run(automation_ids())
    env = {k: v for k, v in alerts.items() if not k.startswith("CIFAR_ALERTS_")}
    done = subprocess.run(
        [*ALERTS_COMMAND, "--block", "custom-webhook/nobody-made-it"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        line for line in done.stderr.strip().splitlines() if line.startswith("deployments.alerts")
    ]
    assert "No notification block 'custom-webhook/nobody-made-it'" in done.stderr
    assert "no webhook URL" in done.stderr
    assert asyncio.run(automation_ids()) == before


@pytest.mark.timeout(600)
def test_alerts_ten_nightlies_crashing_at_once_send_ten_notifications(
    alerts: dict[str, str], webhook: Webhook
) -> None:
    """Each crashes as soon as the worker starts it (its command is `false`): a night of
    failures without ten flow processes on 2 cores; the deployment's limit queues them."""
    runs = [
        run_deployment("train-cifar/nightly", job_variables={"command": "false"}, timeout=0)
        for _ in range(RUNS)
    ]
    names = [run.name for run in runs]
    notified = _notified(webhook, _runs(*names), NOTIFY_WITHIN_S)
    assert sorted(notified) == sorted(names)
    for name, message in notified.items():
        assert message["subject"] == f"train-cifar/nightly: run {name} Crashed"
        assert "ended Crashed" in message["body"]


@contextmanager
def _session_worker_stopped(env: dict[str, str]) -> Iterator[None]:
    """The session's worker frozen (SIGSTOP): it neither polls nor sends heartbeats."""
    worker = psutil.Process(int(env[WORKER_PID]))
    worker.suspend()
    try:
        yield
    finally:
        worker.resume()


def test_alerts_a_run_no_worker_starts_and_a_pool_without_workers(
    alerts: dict[str, str], webhook: Webhook
) -> None:
    with _session_worker_stopped(alerts):
        run = run_deployment("train-cifar/nightly", timeout=0)  # due now; nobody takes it
        found = _notified(webhook, {**_runs(run.name), "cifar": "work pool cifar:"}, 240)
        asyncio.run(_cancel(run.id))
    assert found[run.name]["subject"] == f"train-cifar/nightly: run {run.name} has not started"
    assert found["cifar"]["subject"] == "work pool cifar: no worker"


async def _cancel(flow_run_id: Any) -> None:
    from prefect.states import Cancelled

    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelled(), force=True)


@pytest.fixture
def archive(http_dir: HttpDir) -> dict[str, str]:
    md5 = write_synthetic_archive(str(http_dir.path / "zombie.tar.gz"), images_per_batch=200)
    return {"data_url": f"{http_dir.url}/zombie.tar.gz", "data_md5": md5}


def _heartbeat_recorded(flow_run_id: Any) -> bool:
    """Whether the server has a heartbeat of the run."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    async def read() -> bool:
        async with get_client() as client:
            page = await client.read_events(
                EventFilter(
                    event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                    resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
                ),
                limit=1,
            )
        return bool(page.events)

    return asyncio.run(read())


@pytest.mark.timeout(900)
def test_alerts_a_run_whose_worker_died_is_crashed_alerted_and_the_next_nightly_runs(
    alerts: dict[str, str], webhook: Webhook, archive: dict[str, str], tmp_path: Path
) -> None:
    store = {"storage_path": str(tmp_path / "store"), "batch_size": 64, "rows_per_file": 250}
    store["mlflow_tracking_uri"] = f"sqlite:///{tmp_path}/mlflow.db"
    watching = sentinel(alerts, "--url", webhook.url)  # the stack runs it beside the server
    with watching, _session_worker_stopped(alerts):
        doomed_worker = start_worker(alerts, "doomed", tmp_path / "doomed.log")
        doomed = run_deployment(
            "train-cifar/nightly", parameters={**archive, **store, "epochs": 500}, timeout=0
        )
        # mid-run: training (its first epoch logged), after a heartbeat reached the server
        logs = flow_run_logs(
            doomed.id, until=lambda logs: any(log.message.startswith("epoch 1/") for log in logs)
        )
        assert any(log.message.startswith("epoch 1/") for log in logs), "it never trained"
        deadline = time.monotonic() + 120
        while not _heartbeat_recorded(doomed.id):  # polling the server, not waiting it out
            assert time.monotonic() < deadline, "the doomed nightly never sent a heartbeat"
            time.sleep(1)
        queued = run_deployment(
            "train-cifar/nightly", parameters={**archive, **store, "epochs": 1}, timeout=0
        )
        # the host dies: its worker and everything it started, at once
        tree = psutil.Process(doomed_worker.pid)
        processes = [tree, *tree.children(recursive=True)]
        killed_at = time.time()
        for process in processes:
            os.kill(process.pid, signal.SIGKILL)
        doomed_worker.wait()
        psutil.wait_procs(processes, timeout=30)
        found = _notified(webhook, _runs(doomed.name), ZOMBIE_WITHIN_S)
        alerted_s = time.time() - killed_at
    assert found[doomed.name]["subject"] == f"train-cifar/nightly: run {doomed.name} Crashed"
    assert "No heartbeat for 90 s while the server was storing events" in found[doomed.name]["body"]
    crashed, after = final_flow_runs([doomed.id, queued.id], timeout=600)
    assert crashed.state.name == "Crashed"
    assert after.state.is_completed(), after.state  # the slot was freed; the queue moved
    print(  # the on-call figures docs/mlops.md quotes (pytest -s shows them)
        f"worker killed: run Crashed after {crashed.state.timestamp.timestamp() - killed_at:.0f}"
        f" s, alert received after {alerted_s:.0f} s, next nightly started after "
        f"{after.start_time.timestamp() - killed_at:.0f} s"
    )


def test_alerts_applied_once_each_when_the_reply_to_a_creation_is_lost(
    alerts: dict[str, str], webhook: Webhook
) -> None:
    """Prefect's client sends a POST again when its reply is lost: the automation the first
    try made is not kept beside the second (each alert would come twice)."""
    with lossy_proxy(alerts["PREFECT_API_URL"], "/automations/") as (proxied, proxy):
        _apply_alerts({**alerts, "PREFECT_API_URL": f"{proxied}/api"}, webhook)
    assert proxy.seen >= 2  # the lost reply, and the client's next try

    async def names() -> list[str]:
        async with get_client() as client:
            return [a.name for a in await client.read_automations()]

    applied = asyncio.run(names())
    assert applied and sorted(applied) == sorted(set(applied))
