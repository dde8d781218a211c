"""deployments/prefect.yaml on a real Prefect server with a real process worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType

from cifar.format import write_synthetic_archive
from tests.conftest import HttpDir
from tests.deployments.conftest import ALERTS_COMMAND, Webhook
from tests.prefect_records import final_flow_runs, flow_finished, flow_run_logs, task_runs
from tests.prefect_stack import REPO

SCHEDULE_DEADLINE_S = 120.0
RUN_TIMEOUT_S = 420


def _run_deployment(name: str, parameters: dict[str, Any]) -> Any:
    from prefect.deployments import run_deployment

    return run_deployment(name=name, parameters=parameters, timeout=RUN_TIMEOUT_S, poll_interval=1)


@pytest.fixture(scope="module")
def manual_run(
    deployed: dict[str, str], http_dir: HttpDir, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    root = tmp_path_factory.mktemp("deployed")
    md5 = write_synthetic_archive(str(http_dir.path / "deployed.tar.gz"), images_per_batch=200)
    parameters = _one_epoch(f"{http_dir.url}/deployed.tar.gz", md5, root)
    return _run_deployment(
        "train-cifar/manual", {**parameters, "registered_model_name": "deployed-classifier"}
    )


def _one_epoch(data_url: str, md5: str, root: Path) -> dict[str, Any]:
    """A small run's parameters: one epoch on ``data_url``, its store and MLflow under ``root``."""
    return {
        "data_url": data_url,
        "data_md5": md5,
        "epochs": 1,
        "batch_size": 64,
        "rows_per_file": 250,
        "storage_path": str(root / "store"),
        "mlflow_tracking_uri": f"sqlite:///{root}/mlflow.db",
    }


async def _artifacts(flow_run_id: Any) -> dict[str, Any]:
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    latest: dict[str, Any] = {}
    for artifact in sorted(found, key=lambda a: a.created):
        latest[artifact.key] = artifact
    return latest


def test_deployment_manual_run_completes(manual_run: Any) -> None:
    assert manual_run.state.is_completed(), manual_run.state
    assert {"model:small_cnn", "world_size:2", "device:cpu"} <= set(manual_run.tags)


def test_deployment_run_shows_progress_metrics_and_summary(manual_run: Any) -> None:
    artifacts = asyncio.run(_artifacts(manual_run.id))
    assert {
        "train-progress",
        "epoch-metrics",
        "train-cifar-summary",
        "promotion",
        "confusion-matrix",
    } <= set(artifacts)
    assert artifacts["train-progress"].data == 100
    rows = json.loads(artifacts["epoch-metrics"].data)
    assert [row["epoch"] for row in rows] == [0]
    summary = artifacts["train-cifar-summary"].data
    assert "deployed-classifier" in summary and "@champion" in summary
    assert "mlflow ui --backend-store-uri" in summary


def test_deployment_logs_rank_zero_lines_in_the_run(manual_run: Any) -> None:
    def rank_zero(messages: list[str]) -> bool:
        return any(m.startswith("epoch 1/1: train loss") for m in messages)

    def trainlib_state(messages: list[str]) -> bool:
        return any("starting (attempt 1) on 2 ranks" in m for m in messages)

    def recorded(logs: list[Any]) -> bool:
        messages = [log.message for log in logs]
        return flow_finished(logs) and rank_zero(messages) and trainlib_state(messages)

    messages = [log.message for log in flow_run_logs(manual_run.id, until=recorded)]
    assert rank_zero(messages), messages
    assert trainlib_state(messages), messages


SCHEDULES = {  # deployments/prefect.yaml: deployment -> (cron, time zone)
    "train-cifar/nightly": ("0 3 * * *", "UTC"),
    "tune-cifar/weekly": ("0 4 * * 0", "UTC"),
    "sweep-storage/daily": ("30 5 * * *", "UTC"),
}


def test_deployment_schedules_are_the_documented_crons(deployed: dict[str, str]) -> None:
    async def schedules(name: str) -> list[tuple[str, str | None]]:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(name)
        return [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules]

    for name, schedule in SCHEDULES.items():
        assert asyncio.run(schedules(name)) == [schedule]
    assert asyncio.run(schedules("train-cifar/manual")) == []
    assert asyncio.run(schedules("predict-cifar/champion")) == []


@pytest.mark.parametrize(
    ("name", "weekday"), [("train-cifar/nightly", None), ("tune-cifar/weekly", 6)]
)
def test_deployment_schedule_creates_runs_at_its_times(
    deployed: dict[str, str], name: str, weekday: int | None
) -> None:
    async def scheduled() -> list[Any]:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(name)
            return await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])
                    )
                ),
            )

    deadline = time.monotonic() + SCHEDULE_DEADLINE_S
    runs = asyncio.run(scheduled())
    while not runs and time.monotonic() < deadline:
        time.sleep(1)  # the server's scheduler loop creates runs on its own clock
        runs = asyncio.run(scheduled())
    assert runs, f"no scheduled run of {name} after {SCHEDULE_DEADLINE_S} s"
    hour = int(SCHEDULES[name][0].split()[1])
    for run in runs:  # each at the cron's time, in UTC; weekly on Sundays
        start = run.expected_start_time.astimezone(timezone.utc)
        assert (start.hour, start.minute, start.second) == (hour, 0, 0), start
        assert weekday is None or start.weekday() == weekday, start


@pytest.fixture(scope="module")
def failing_nightlies(
    deployed: dict[str, str],
    webhook: Webhook,
    http_dir: HttpDir,
    tmp_path_factory: pytest.TempPathFactory,
) -> list[Any]:
    """Alerts applied as the docs say, then two nightly runs started at once, both failing
    (their archive does not exist)."""
    subprocess.run(
        [*ALERTS_COMMAND, "--block", "custom-webhook/cifar-alerts", "--url", webhook.url],
        env=deployed,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    root = tmp_path_factory.mktemp("nightly")
    parameters = {
        "data_url": f"{http_dir.url}/no-such-archive.tar.gz",
        "storage_path": str(root / "store"),
        "mlflow_tracking_uri": f"sqlite:///{root}/mlflow.db",
    }
    from prefect.deployments import run_deployment

    started = [
        run_deployment("train-cifar/nightly", parameters=parameters, timeout=0) for _ in range(2)
    ]
    return final_flow_runs([run.id for run in started], timeout=RUN_TIMEOUT_S)


def test_deployment_nightly_runs_one_at_a_time(failing_nightlies: list[Any]) -> None:
    async def history(flow_run_id: Any) -> list[str]:
        async with get_client() as client:
            return [s.name for s in await client.read_flow_run_states(flow_run_id)]

    assert [run.state.type for run in failing_nightlies] == [StateType.FAILED] * 2
    waited = [
        r for r in failing_nightlies if "AwaitingConcurrencySlot" in asyncio.run(history(r.id))
    ]
    assert len(waited) >= 1  # one of them was held back by the limit, and not dropped
    first, second = sorted(failing_nightlies, key=lambda r: r.start_time)
    assert first.end_time <= second.start_time  # never running at the same time


def test_deployment_manual_waits_for_the_nightly_training(
    deployed: dict[str, str], http_dir: HttpDir, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The training slot with no Prefect limit (tasks/training_slot.py): `manual` and `nightly`
    started at once, each on a LocalCluster of its own on this host, both complete, and their
    trainings (the train tasks) never overlap."""
    md5 = write_synthetic_archive(str(http_dir.path / "slot.tar.gz"), images_per_batch=200)
    from prefect.deployments import run_deployment

    started = []
    for deployment in ("train-cifar/nightly", "train-cifar/manual"):
        parameters = _one_epoch(f"{http_dir.url}/slot.tar.gz", md5, tmp_path_factory.mktemp("slot"))
        started.append(run_deployment(deployment, parameters=parameters, timeout=0))
    runs = final_flow_runs([run.id for run in started], timeout=RUN_TIMEOUT_S)
    assert [run.state.type for run in runs] == [StateType.COMPLETED] * 2, runs
    trainings = [task_runs(run.id, ["train"])["train"] for run in runs]
    assert all(t.state_name == "Completed" for t in trainings), trainings
    held = [_slot_held(run.id) for run in runs]  # (took, released) of each training
    first, second = sorted(held)
    assert first[1] <= second[0]  # the second took the slot once the first released it


def _slot_held(flow_run_id: Any) -> tuple[datetime, datetime]:
    """When a run's training took the training slot and released it, from its logs."""
    logs = flow_run_logs(flow_run_id, flow_finished)
    took = [log.timestamp for log in logs if "holds the training slot" in log.message]
    released = [log.timestamp for log in logs if "releases the training slot" in log.message]
    assert len(took) == 1 and len(released) == 1, [log.message for log in logs]
    return took[0], released[0]


def test_deployment_failed_nightly_notifies_the_webhook(
    failing_nightlies: list[Any], webhook: Webhook
) -> None:
    names = {run.name for run in failing_nightlies}
    notified = set()
    while notified != names:
        message = webhook.received.get(timeout=120)  # the server's automation posts it
        assert message["subject"].startswith("train-cifar/nightly: run ")
        assert "ended Failed" in message["body"]
        notified |= {name for name in names if name in message["subject"]}
    assert notified == names
