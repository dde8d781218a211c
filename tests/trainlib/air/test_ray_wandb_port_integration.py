"""Ray Tune's "Using Weights & Biases with Tune" by import swap: ``WandbLoggerCallback`` and
``setup_wandb`` as the guide uses them (doc/source/tune/examples/tune-wandb.ipynb, sizes cut:
2 grid points, 3 results a trial), W&B offline (``WANDB_MODE=offline``); what W&B recorded is
read back from its run files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import run_script_for_result, trainlib_processes
from tests.trainlib.air.wandb_records import offline_runs
from tests.trainlib.tune.test_ray_tune_port_integration import swap_module_imports

RAY_WANDB_GUIDE = """
import numpy as np

from ray import train, tune
from ray.air.integrations.wandb import WandbLoggerCallback, setup_wandb


def train_function(config):
    for i in range(3):
        loss = config["mean"] + config["sd"] * np.random.randn()
        train.report({"loss": loss})


def tune_with_callback():
    \"\"\"Example for using a WandbLoggerCallback with the function API\"\"\"
    tuner = tune.Tuner(
        train_function,
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
        ),
        run_config=train.RunConfig(
            name="with_callback",
            callbacks=[WandbLoggerCallback(project="Wandb_example")]
        ),
        param_space={
            "mean": tune.grid_search([1, 2]),
            "sd": tune.uniform(0.2, 0.8),
        },
    )
    tuner.fit()


def train_function_wandb(config):
    wandb = setup_wandb(config, project="Wandb_example")

    for i in range(3):
        loss = config["mean"] + config["sd"] * np.random.randn()
        train.report({"loss": loss})
        wandb.log(dict(loss=loss))


def tune_with_setup():
    \"\"\"Example for using the setup_wandb utility with the function API\"\"\"
    tuner = tune.Tuner(
        train_function_wandb,
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
        ),
        run_config=train.RunConfig(name="with_setup"),
        param_space={
            "mean": tune.grid_search([1, 2]),
            "sd": tune.uniform(0.2, 0.8),
        },
    )
    tuner.fit()


tune_with_callback()
tune_with_setup()
print("RESULT {}")
"""


def test_ray_wandb_guide_runs_with_imports_swapped(tmp_path: Path) -> None:
    before = {p.pid for p in trainlib_processes()}
    script = tmp_path / "wandb_guide.py"
    source = swap_module_imports(RAY_WANDB_GUIDE).replace("ray.air.", "trainlib.air.")
    script.write_text(source)
    env = {
        **os.environ,
        "HOME": str(tmp_path),  # the default storage path's home
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb_setup"),  # setup_wandb's runs (the ranks' cwd else)
        "WANDB_SILENT": "true",
    }
    run_script_for_result(script, cwd=tmp_path, env=env)
    results = tmp_path / "trainlib_results"

    logged = offline_runs(results / "with_callback")  # in each trial's folder
    assert [run.run_id for run in logged] == ["trial_00000", "trial_00001"]
    for run, mean in zip(logged, (1, 2), strict=True):
        assert (run.name, run.group, run.project) == (run.run_id, "with_callback", "Wandb_example")
        assert run.config["mean"] == mean and 0.2 <= run.config["sd"] <= 0.8
        assert [row["training_iteration"] for row in run.history] == [1, 2, 3]
        assert all(isinstance(row["loss"], float) for row in run.history)
        assert not any("config/mean" in row or "done" in row for row in run.history)
        assert run.config["trial_id"] == run.run_id  # Ray's result keys that go to the config
        assert run.exit_code == 0

    set_up = offline_runs(tmp_path / "wandb_setup")  # one run a trial, from its rank
    assert [run.run_id for run in set_up] == ["trial_00000", "trial_00001"]
    for run in set_up:
        assert (run.group, run.project) == ("with_setup", "Wandb_example")
        assert len(run.history) == 3 and all("loss" in row for row in run.history)
        assert run.config["mean"] in (1, 2)
    assert {p.pid for p in trainlib_processes()} <= before


def test_wandb_callback_needs_a_project_and_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainlib.air.integrations.wandb import WandbLoggerCallback

    monkeypatch.delenv("WANDB_PROJECT_NAME", raising=False)
    with pytest.raises(ValueError, match="needs a project"):
        WandbLoggerCallback().setup()
    key = tmp_path / "key"
    key.write_text("k" * 40 + "\n")
    with pytest.raises(ValueError, match="give one"):
        WandbLoggerCallback(project="p", api_key="x", api_key_file=str(key)).setup()
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    WandbLoggerCallback(project="p", api_key_file=str(key)).setup()
    assert os.environ["WANDB_API_KEY"] == "k" * 40
