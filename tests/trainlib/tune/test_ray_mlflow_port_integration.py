"""Ray Tune's "Using MLflow with Tune" runs on trainlib with only the imports swapped.

RAY_MLFLOW_EXAMPLE is the example's code (doc/source/tune/examples/tune-mlflow.ipynb), as
written there but for the sizes (2 trials instead of 5) and where MLflow keeps its runs (a
SQLite store in the test's folder instead of ``mlruns`` in the system's temporary folder). Both
of its integrations log into a real MLflow store; the test reads what they logged.

Its two searches run as two scripts, each with its own home (the default storage path's): both
are named "mlflow", and a second trainlib Tuner of a name resumes the first search where Ray's
runs a search of its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tests.helpers import run_script_for_result, trainlib_processes
from tests.trainlib.tune.test_ray_tune_port_integration import swap_module_imports

CALL_WITH_CALLBACK = """tune_with_callback(mlflow_tracking_uri, finish_fast=smoke_test)
if not smoke_test:
    df = mlflow.search_runs(
        [mlflow.get_experiment_by_name("mlflow_callback_example").experiment_id]
    )
    print(df)
"""
CALL_WITH_SETUP = CALL_WITH_CALLBACK.replace("callback", "setup").replace(
    "mlflow_setup_example", "setup_mlflow_example"
)

RAY_MLFLOW_EXAMPLE = """
import os
import tempfile
import time

import mlflow

from ray import tune
from ray.air.integrations.mlflow import MLflowLoggerCallback, setup_mlflow


def evaluation_fn(step, width, height):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def train_function(config):
    width, height = config["width"], config["height"]

    for step in range(config.get("steps", 100)):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height)
        # Feed the score back to Tune.
        tune.report({"iterations": step, "mean_loss": intermediate_score})
        time.sleep(0.1)


def tune_with_callback(mlflow_tracking_uri, finish_fast=False):
    tuner = tune.Tuner(
        train_function,
        tune_config=tune.TuneConfig(num_samples=2),
        run_config=tune.RunConfig(
            name="mlflow",
            callbacks=[
                MLflowLoggerCallback(
                    tracking_uri=mlflow_tracking_uri,
                    experiment_name="mlflow_callback_example",
                    save_artifact=True,
                )
            ],
        ),
        param_space={
            "width": tune.randint(10, 100),
            "height": tune.randint(0, 100),
            "steps": 5 if finish_fast else 100,
        },
    )
    results = tuner.fit()


def train_function_mlflow(config):
    tracking_uri = config.pop("tracking_uri", None)
    setup_mlflow(
        config,
        experiment_name="setup_mlflow_example",
        tracking_uri=tracking_uri,
    )

    # Hyperparameters
    width, height = config["width"], config["height"]

    for step in range(config.get("steps", 100)):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height)
        # Log the metrics to mlflow
        mlflow.log_metrics(dict(mean_loss=intermediate_score), step=step)
        # Feed the score back to Tune.
        tune.report({"iterations": step, "mean_loss": intermediate_score})
        time.sleep(0.1)


def tune_with_setup(mlflow_tracking_uri, finish_fast=False):
    # Set the experiment, or create a new one if does not exist yet.
    mlflow.set_tracking_uri(mlflow_tracking_uri)
    mlflow.set_experiment(experiment_name="setup_mlflow_example")

    tuner = tune.Tuner(
        train_function_mlflow,
        tune_config=tune.TuneConfig(num_samples=2),
        run_config=tune.RunConfig(
            name="mlflow",
        ),
        param_space={
            "width": tune.randint(10, 100),
            "height": tune.randint(0, 100),
            "steps": 5 if finish_fast else 100,
            "tracking_uri": mlflow.get_tracking_uri(),
        },
    )
    results = tuner.fit()


smoke_test = True

if smoke_test:
    mlflow_tracking_uri = "sqlite:///" + os.path.abspath("mlflow.db")
else:
    mlflow_tracking_uri = "<MLFLOW_TRACKING_URI>"

tune_with_callback(mlflow_tracking_uri, finish_fast=smoke_test)
if not smoke_test:
    df = mlflow.search_runs(
        [mlflow.get_experiment_by_name("mlflow_callback_example").experiment_id]
    )
    print(df)

tune_with_setup(mlflow_tracking_uri, finish_fast=smoke_test)
if not smoke_test:
    df = mlflow.search_runs(
        [mlflow.get_experiment_by_name("setup_mlflow_example").experiment_id]
    )
    print(df)
"""

# A trial that checkpoints, then fails, logged by the same callback (not in Ray's example).
FAILING_TRIAL = """

def train_function_failing(config):
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "model.pt"), "w") as weights:
            weights.write("weights")
        checkpoint = tune.Checkpoint.from_directory(directory)
        tune.report({"iterations": 0, "mean_loss": 1.0}, checkpoint=checkpoint)
    raise ValueError("the loss is NaN")


tune.Tuner(
    train_function_failing,
    run_config=tune.RunConfig(
        name="mlflow_failing",
        callbacks=[
            MLflowLoggerCallback(
                tracking_uri=mlflow_tracking_uri,
                experiment_name="mlflow_failing_example",
                save_artifact=True,
            )
        ],
    ),
).fit()
print("RESULT {}")
"""


def runs_of(client: MlflowClient, experiment_name: str) -> list[Any]:
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None, f"no experiment {experiment_name}"
    return list(client.search_runs([experiment.experiment_id]))


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def evaluation_fn(step: int, width: float, height: float) -> float:
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def test_ray_tune_mlflow_example_runs_with_imports_swapped(tmp_path: Path) -> None:
    """One MLflow run per trial from each integration, with the trial's config and its whole
    metrics history; a failed trial's run ends FAILED."""
    before = {p.pid for p in trainlib_processes()}
    ported = swap_module_imports(RAY_MLFLOW_EXAMPLE.replace("from ray.air", "from trainlib.air"))
    assert CALL_WITH_CALLBACK in ported and CALL_WITH_SETUP in ported
    scripts = {
        "callback": ported.replace(CALL_WITH_SETUP, "") + FAILING_TRIAL,
        "setup": ported.replace(CALL_WITH_CALLBACK, "") + '\nprint("RESULT {}")\n',
    }
    for name, source in scripts.items():
        script = tmp_path / f"{name}.py"
        script.write_text(source)
        home = {**os.environ, "HOME": str(tmp_path / name)}
        run_script_for_result(script, cwd=tmp_path, env=home)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")

    logged = runs_of(client, "mlflow_callback_example")  # MLflowLoggerCallback's
    assert len(logged) == 2
    assert {run.data.tags["trial_name"] for run in logged} == {r.info.run_name for r in logged}
    for run in logged:
        params = run.data.params
        assert run.info.status == "FINISHED"
        assert params["steps"] == "5"
        width, height = int(params["width"]), int(params["height"])
        assert 10 <= width < 100 and 0 <= height < 100
        expected = [(step + 1, evaluation_fn(step, width, height)) for step in range(5)]
        assert history(client, run.info.run_id, "mean_loss") == expected
        assert history(client, run.info.run_id, "iterations") == [(s + 1, s) for s in range(5)]

    set_up = runs_of(client, "setup_mlflow_example")  # setup_mlflow's, in the trials
    assert len(set_up) == 2
    for run in set_up:
        params = run.data.params
        assert run.info.status == "FINISHED"
        assert "tracking_uri" not in params  # popped before setup_mlflow logged the config
        width, height = int(params["width"]), int(params["height"])
        expected = [(step, evaluation_fn(step, width, height)) for step in range(5)]
        assert history(client, run.info.run_id, "mean_loss") == expected

    (failed,) = runs_of(client, "mlflow_failing_example")
    assert failed.info.status == "FAILED"
    assert history(client, failed.info.run_id, "mean_loss") == [(1, 1.0)]
    uploaded = {a.path for a in client.list_artifacts(failed.info.run_id)}
    # the trial's directory: its one checkpoint and the default loggers' files
    (checkpoint_dir,) = [path for path in uploaded if path.startswith("checkpoint_")]
    assert {"result.json", "progress.csv", "params.json"} <= uploaded
    files = {a.path for a in client.list_artifacts(failed.info.run_id, checkpoint_dir)}
    assert f"{checkpoint_dir}/model.pt" in files
    assert {p.pid for p in trainlib_processes()} <= before
