"""The tune-cifar flow end to end: real Prefect, MLflow, Dask, Optuna and gloo."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import optuna
import pytest
from distributed import Client
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)

from cifar.format import write_synthetic_archive
from flows.time_limit import TimeLimitExceeded
from flows.tune_cifar import tune_cifar
from tasks.tune import TRIALS_KEY
from tests.conftest import HttpDir
from tests.helpers import rank_processes, working_ranks

MODEL = "tune-e2e-classifier"


@pytest.fixture(scope="module")
def searched(
    prefect_server: None, http_dir: HttpDir, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str, UUID]:
    """The summary, MLflow tracking URI and flow run of a search of 2 trials, one at a time:
    lr=0.05 first, which completes both epochs; then lr=0.0, which never learns and so is
    below it at epoch 1, where ASHA stops it. (Run at once, either could reach epoch 1
    first: the first trial at a rung always goes on, so lr=0.0 would complete.)"""
    root = tmp_path_factory.mktemp("tune-flow")
    md5 = write_synthetic_archive(str(http_dir.path / "tune-cifar.tar.gz"), images_per_batch=100)
    tracking_uri = f"sqlite:///{root}/mlflow.db"
    old_cwd = os.getcwd()
    os.chdir(root)  # MLflow's sqlite store keeps artifacts in ./mlruns
    try:
        state = tune_cifar(
            data_url=f"{http_dir.url}/tune-cifar.tar.gz",
            data_md5=md5,
            storage_path=str(root / "store"),
            search_space={"lr": ["grid_search", [0.05, 0.0]], "batch_size": ["choice", [64]]},
            num_samples=1,
            max_concurrent_trials=1,
            epochs=2,
            num_workers=1,
            rows_per_file=250,
            mlflow_tracking_uri=tracking_uri,
            registered_model_name=MODEL,
            study_storage=f"sqlite:///{root}/optuna.db",  # as a postgresql:// URL would be
            return_state=True,
        )
    finally:
        os.chdir(old_cwd)
    return state.result(), tracking_uri, state.state_details.flow_run_id


def test_tune_flow_registers_and_promotes_the_best_trial(
    searched: tuple[dict[str, Any], str, UUID],
) -> None:
    summary, tracking_uri, _ = searched
    assert summary["best_config"]["lr"] == 0.05  # lr=0 never learns
    assert (summary["model_version"], summary["promoted"]) == ("1", True)
    client = MlflowClient(tracking_uri)
    version = client.get_model_version_by_alias(MODEL, "champion")
    assert version.run_id == summary["mlflow_run_id"]
    assert rank_processes() == []


def test_tune_flow_keeps_its_study_in_the_storage_given(
    searched: tuple[dict[str, Any], str, UUID],
) -> None:
    _, tracking_uri, _ = searched
    root = tracking_uri.removeprefix("sqlite:///").rsplit("/", 1)[0]
    (study,) = optuna.get_all_study_summaries(f"sqlite:///{root}/optuna.db")
    assert study.n_trials == 2
    assert not list(Path(root, "store").rglob("*.db"))  # no sqlite study beside the runs


def test_tune_flow_tracks_one_nested_run_per_trial(
    searched: tuple[dict[str, Any], str, UUID],
) -> None:
    summary, tracking_uri, _ = searched
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("tune-cifar")
    assert experiment is not None
    children = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary['search_run_id']}'",
    )
    states = {float(r.data.params["lr"]): r.data.tags["trial_state"] for r in children}
    assert states == {0.05: "complete", 0.0: "pruned"}
    assert summary["mlflow_run_id"] in {r.info.run_id for r in children}
    for run in children:  # every trial names the data it trained on, never the test split
        inputs = run.inputs.dataset_inputs
        splits = sorted(d.dataset.name.rsplit("/", 1)[-1] for d in inputs)
        assert splits == ["train", "val"]
        assert run.data.tags["data_digest"] == children[0].data.tags["data_digest"]


def test_tune_flow_shows_a_table_of_trials(
    searched: tuple[dict[str, Any], str, UUID], prefect_server: None
) -> None:
    _, _, flow_run_id = searched

    async def tables() -> Any:
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[TRIALS_KEY]),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                )
            )

    versions = asyncio.run(tables())
    final = max(versions, key=lambda a: a.created)
    rows = json.loads(final.data) if isinstance(final.data, str) else final.data
    assert {row["lr"]: row["state"] for row in rows} == {0.05: "complete", 0.0: "pruned"}
    assert len(versions) == 4  # updated as each of the 2 trials started and ended


def test_tune_flow_over_its_time_limit_fails_naming_it_and_registers_nothing(
    prefect_server: None, http_dir: HttpDir, tmp_path: Path, dask_client: Client
) -> None:
    """A search that outlasts ``timeout_minutes`` (15 s, its trial mid-training) fails soon
    after, naming the limit; its ranks are stopped and no model is registered."""
    md5 = write_synthetic_archive(str(http_dir.path / "tune-slow.tar.gz"), images_per_batch=100)
    tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"
    started = time.monotonic()
    state = tune_cifar(
        data_url=f"{http_dir.url}/tune-slow.tar.gz",
        data_md5=md5,
        storage_path=str(tmp_path / "store"),
        search_space={"lr": ["choice", [0.05]]},
        num_samples=1,
        epochs=100_000,
        num_workers=1,
        rows_per_file=250,
        dask_address=dask_client.scheduler.address,
        mlflow_tracking_uri=tracking_uri,
        registered_model_name="tune-over-its-time",
        timeout_minutes=0.25,
        return_state=True,
    )
    took = time.monotonic() - started
    assert state.is_failed(), state
    with pytest.raises(TimeLimitExceeded, match=r"tune-cifar ran longer .* timeout_minutes=0\.25"):
        state.result()
    assert 15 <= took < 15 + 20
    deadline = time.monotonic() + 10
    while (ranks := working_ranks(dask_client)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the process table for the ranks' exit, bounded
    assert ranks == []
    found = MlflowClient(tracking_uri).search_registered_models("name = 'tune-over-its-time'")
    assert found == []
