"""deployments/prefect.yaml on a real Prefect server with a real process worker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
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
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL, temporary_settings

from cifar.format import write_synthetic_archive
from tests.conftest import HttpDir
from tests.prefect_stack import deploy_all

SCHEDULE_DEADLINE_S = 120.0
RUN_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def deployed(prefect_env: dict[str, str]) -> Iterator[dict[str, str]]:
    deploy_all(prefect_env)
    with temporary_settings({PREFECT_API_URL: prefect_env["PREFECT_API_URL"]}):
        yield prefect_env


def _run_deployment(name: str, parameters: dict[str, Any]) -> Any:
    from prefect.deployments import run_deployment

    return run_deployment(name=name, parameters=parameters, timeout=RUN_TIMEOUT_S, poll_interval=1)


@pytest.fixture(scope="module")
def manual_run(
    deployed: dict[str, str], http_dir: HttpDir, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    root = tmp_path_factory.mktemp("deployed")
    md5 = write_synthetic_archive(str(http_dir.path / "deployed.tar.gz"), images_per_batch=200)
    return _run_deployment(
        "train-cifar/manual",
        {
            "data_url": f"{http_dir.url}/deployed.tar.gz",
            "data_md5": md5,
            "epochs": 1,
            "batch_size": 64,
            "shard_size": 250,
            "storage_path": str(root / "store"),
            "mlflow_tracking_uri": f"sqlite:///{root}/mlflow.db",
            "registered_model_name": "deployed-classifier",
        },
    )


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
    async def read() -> list[str]:
        async with get_client() as client:
            logs = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[manual_run.id]))
            )
        return [log.message for log in logs]

    messages = asyncio.run(read())
    assert any(m.startswith("epoch 1/1: train loss") for m in messages)
    assert any("starting (attempt 1) on 2 ranks" in m for m in messages)  # trainlib's state


@pytest.mark.parametrize("name", ["train-cifar/nightly", "tune-cifar/weekly"])
def test_deployment_schedule_creates_runs(deployed: dict[str, str], name: str) -> None:
    async def scheduled() -> int:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(name)
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])
                    )
                ),
            )
        return len(runs)

    deadline = time.monotonic() + SCHEDULE_DEADLINE_S
    count = asyncio.run(scheduled())
    while count == 0 and time.monotonic() < deadline:
        time.sleep(1)  # the server's scheduler loop creates runs on its own clock
        count = asyncio.run(scheduled())
    assert count >= 1
