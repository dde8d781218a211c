"""A Ray Tune + Ray Train search runs on trainlib with only the imports swapped.

RAY_EXAMPLE is written the way Ray's "Hyperparameter Tuning with Ray Tune" guide tunes a
``TorchTrainer``: ``Tuner(trainer, param_space={"train_loop_config": {...}},
tune_config=tune.TuneConfig(...))``, a tiny regression instead of a dataset to download. The
test swaps ``ray.tune`` for ``trainlib.tune`` and ``ray.train`` for ``trainlib`` and runs the
script as a user would: ``python script.py``, so the Tuner starts and closes its own cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import run_script_for_result, trainlib_processes

RAY_EXAMPLE = """
import os
import tempfile

import torch
from torch import nn

import ray.train
import ray.tune
from ray.train.torch import TorchTrainer
from ray.tune import Tuner


def train_func(config):
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x = torch.randn(64, 4)
    y = x.sum(dim=1, keepdim=True)
    for epoch in range(config["num_epochs"]):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            ray.train.report(
                {"loss": loss.item(), "epoch": epoch},
                checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )


trainer = TorchTrainer(
    train_func,
    train_loop_config={"num_epochs": 2},
    scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False),
    run_config=ray.train.RunConfig(storage_path=os.path.abspath("results")),
)
tuner = Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": ray.tune.grid_search([0.001, 0.1])}},
    tune_config=ray.tune.TuneConfig(metric="loss", mode="min", num_samples=1),
)
result_grid = tuner.fit()
best_result = result_grid.get_best_result()

with best_result.checkpoint.as_directory() as checkpoint_dir:
    model = nn.Linear(4, 1)
    model.load_state_dict(torch.load(os.path.join(checkpoint_dir, "model.pt"), weights_only=True))
"""

PRINT_RESULT = (
    "\nimport json\n"
    'print("RESULT", json.dumps({"trials": len(result_grid), '
    '"errors": result_grid.num_errors, "best": best_result.config}))\n'
)


def swap_imports(source: str) -> str:
    """What a user porting from Ray changes: ``ray.tune`` -> ``trainlib.tune``,
    ``ray.train`` -> ``trainlib``."""
    return source.replace("ray.tune", "trainlib.tune").replace("ray.train", "trainlib")


def test_ray_tune_train_example_runs_with_imports_swapped(tmp_path: Path) -> None:
    before = {p.pid for p in trainlib_processes()}  # other clusters' idle rank processes
    script = tmp_path / "tune_example.py"
    script.write_text(swap_imports(RAY_EXAMPLE) + PRINT_RESULT)
    result = run_script_for_result(script, cwd=tmp_path)
    assert result["trials"] == 2
    assert result["errors"] == 0
    assert result["best"]["train_loop_config"]["lr"] == 0.1  # the faster of the two
    assert {p.pid for p in trainlib_processes()} <= before  # nothing left behind


# Ray Train v2's "Hyperparameter Tuning with Ray Tune" quickstart
# (doc/source/train/doc_code/train_tune_interop.py), as written there but for the sizes: the
# single run and the trials use 1 or 2 workers instead of 2 or 4 (two cores here).
RAY_V2_QUICKSTART = """
import random
import tempfile
import uuid

import ray.train
import ray.train.torch
import ray.tune
from ray.tune.integration.ray_train import TuneReportCallback


def train_fn_per_worker(train_loop_config: dict):
    lr = train_loop_config["lr"]
    print(
        ray.train.get_context().get_world_size(),
        ray.train.get_context().get_world_rank(),
        train_loop_config,
    )
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        ray.train.report(
            {"loss": random.random()},
            checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir),
        )


def train_driver_fn(config: dict):
    num_workers = config["num_workers"]

    trainer = ray.train.torch.TorchTrainer(
        train_fn_per_worker,
        train_loop_config=config["train_loop_config"],
        scaling_config=ray.train.ScalingConfig(
            num_workers=num_workers,
        ),
        run_config=ray.train.RunConfig(
            name=f"train-trial_id={ray.tune.get_context().get_trial_id()}",
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


train_driver_fn({"num_workers": 2, "train_loop_config": {"lr": 1e-3}})


tuner = ray.tune.Tuner(
    train_driver_fn,
    param_space={
        "num_workers": ray.tune.choice([1, 2]),
        "train_loop_config": {
            "lr": ray.tune.grid_search([1e-3, 3e-4]),
            "batch_size": ray.tune.grid_search([32, 64]),
        },
    },
    run_config=ray.tune.RunConfig(
        name=f"tune_train_example-{uuid.uuid4().hex[:6]}",
    ),
    tune_config=ray.tune.TuneConfig(max_concurrent_trials=2),
)
results = tuner.fit()

print(results.get_best_result(metric="loss", mode="min"))
"""

PRINT_V2_RESULT = (
    "\nimport json\n"
    "best = results.get_best_result(metric='loss', mode='min')\n"
    'print("RESULT", json.dumps({"trials": len(results), "errors": results.num_errors, '
    '"losses": sorted(r.metrics["loss"] for r in results), '
    '"checkpoints": sorted(r.metrics["checkpoint_path"] for r in results), '
    '"best": best.metrics["loss"]}))\n'
)


def test_ray_train_v2_tuned_by_tune_runs_with_imports_swapped(tmp_path: Path) -> None:
    """A Tune trial function that builds a TorchTrainer and forwards its reports with
    TuneReportCallback: every trial's Train run places its ranks on the Tuner's cluster."""
    before = {p.pid for p in trainlib_processes()}
    script = tmp_path / "train_tune_interop.py"
    script.write_text(swap_imports(RAY_V2_QUICKSTART) + PRINT_V2_RESULT)
    home = {**os.environ, "HOME": str(tmp_path)}  # RunConfig's default: ~/trainlib_results
    result = run_script_for_result(script, cwd=tmp_path, env=home)
    assert (result["trials"], result["errors"]) == (4, 0)
    assert result["best"] == min(result["losses"])
    runs = sorted((tmp_path / "trainlib_results").glob("train-trial_id=trial_*"))
    assert [r.name for r in runs] == [f"train-trial_id=trial_0000{i}" for i in range(4)]
    assert [Path(c).parent for c in result["checkpoints"]] == runs  # each trial's own run
    assert all(Path(c).is_dir() for c in result["checkpoints"])
    assert (tmp_path / "trainlib_results" / "train-trial_id=None").is_dir()  # the single run
    assert {p.pid for p in trainlib_processes()} <= before
