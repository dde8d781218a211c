"""The MLflow integrations on a real MLflow store (SQLite): parameters and metrics as MLflow
holds them, the experiment as Ray's docs choose it, what counts as MLflow out of reach;
``setup_mlflow`` outside a training function; the logger callback on a trainer's run (a
search's trials: tests/trainlib/tune/test_ray_mlflow_port_integration.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient

import trainlib
from trainlib import RunConfig, ScalingConfig, WorkerGroupError
from trainlib.air.integrations._mlflow_store import experiment_id_of, is_transient, numeric
from trainlib.air.integrations.mlflow import MLflowLoggerCallback, setup_mlflow
from trainlib.torch import TorchTrainer
from trainlib.tune.logger import flatten


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (each test's experiments named apart)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def client(store: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowClient]:
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    yield MlflowClient(tracking_uri=store)


def test_a_config_is_flattened_and_only_numbers_are_metrics() -> None:
    config = {"lr": 0.1, "model": {"depth": 3, "act": "relu"}, "train_loop_config": {}}
    assert flatten(config) == {"lr": 0.1, "model/depth": 3, "model/act": "relu"}
    metrics = {"loss": np.float32(0.5), "epoch": 2, "done": True, "note": "x", "m": {"a": 1}}
    assert numeric(metrics) == {"loss": 0.5, "epoch": 2.0, "done": 1.0, "m/a": 1.0}


def test_the_experiment_given_wins_over_the_environment(
    client: MlflowClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = client.create_experiment("set_by_mlflow_set_experiment")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", other)  # as mlflow.set_experiment leaves it
    created = experiment_id_of(client, None, "mine", create=True)
    assert client.get_experiment(created).name == "mine"
    assert experiment_id_of(client, None, "mine", create=False) == created  # found again
    assert experiment_id_of(client, created, "ignored", create=False) == created  # id first
    assert experiment_id_of(client, "no-such-id", "mine", create=False) == created
    assert experiment_id_of(client, None, None, create=False) == other  # nothing given


def test_a_missing_experiment_not_to_be_created_names_the_fix(client: MlflowClient) -> None:
    with pytest.raises(ValueError, match="create_experiment_if_not_exists=True"):
        experiment_id_of(client, None, "absent", create=False)
    with pytest.raises(ValueError, match=r"experiment_name=\.\.\."):
        experiment_id_of(client, None, None, create=True)
    assert client.get_experiment_by_name("absent") is None  # nothing created


def test_only_errors_of_mlflow_out_of_reach_are_transient() -> None:
    refused = requests.ConnectionError("connection refused")
    try:
        raise MlflowException("API request failed") from refused
    except MlflowException as wrapped:
        assert is_transient(wrapped)
    assert is_transient(MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE))
    assert is_transient(TimeoutError())
    assert not is_transient(MlflowException("bad value", error_code=INVALID_PARAMETER_VALUE))
    assert not is_transient(ValueError("no experiment"))


def test_setup_mlflow_outside_a_training_function_starts_a_run_with_the_config(
    client: MlflowClient, store: str
) -> None:
    uri = store
    before = mlflow.get_tracking_uri()
    try:
        logging = setup_mlflow(
            {"lr": 0.1, "model": {"depth": 3}},
            tracking_uri=uri,
            experiment_name="setup",
            create_experiment_if_not_exists=True,
        )
        logging.log_metric("loss", 0.25, step=1)
        run = mlflow.active_run()
        assert run is not None
        run_id = run.info.run_id
    finally:
        mlflow.end_run()
        mlflow.set_tracking_uri(before)
    stored = client.get_run(run_id)
    assert stored.data.params == {"lr": "0.1", "model/depth": "3"}
    assert stored.data.metrics == {"loss": 0.25}
    assert stored.info.run_name == "setup"
    assert client.get_experiment(stored.info.experiment_id).name == "setup"


def report_three_losses(config: dict[str, Any]) -> None:
    for epoch in range(3):
        trainlib.report({"loss": 1.0 / (epoch + 1), "phase": "train"})
    if config.get("fail"):
        raise ValueError("the loss is NaN")


@pytest.mark.parametrize("fail", [False, True])
def test_the_logger_callback_logs_a_trainers_run_as_one_mlflow_run(
    client: MlflowClient, store: str, tmp_path: Path, fail: bool
) -> None:
    """Outside a search (a TorchTrainer's run, here in local mode) the callback logs the run
    itself: its reports' numeric metrics by training iteration, ended with the run."""
    experiment = f"trainer_{fail}"
    trainer = TorchTrainer(
        report_three_losses,
        train_loop_config={"fail": fail},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="plain",
            storage_path=str(tmp_path),
            callbacks=[MLflowLoggerCallback(tracking_uri=store, experiment_name=experiment)],
        ),
    )
    if fail:
        with pytest.raises(WorkerGroupError, match="the loss is NaN"):
            trainer.fit()
    else:
        trainer.fit()
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (run,) = client.search_runs([found.experiment_id])
    assert run.info.status == ("FAILED" if fail else "FINISHED")
    assert run.data.tags["trial_name"] == "plain"
    losses = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert losses == [(1, 1.0), (2, 0.5), (3, 1.0 / 3)]
    assert "phase" not in run.data.metrics  # not a number
