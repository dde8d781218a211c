"""A Ray Tune + Ray Train search runs on trainlib with only the imports swapped.

RAY_EXAMPLE is written the way Ray's "Hyperparameter Tuning with Ray Tune" guide tunes a
``TorchTrainer``: ``Tuner(trainer, param_space={"train_loop_config": {...}},
tune_config=tune.TuneConfig(...))``, a tiny regression instead of a dataset to download. The
test swaps ``ray.tune`` for ``trainlib.tune`` and ``ray.train`` for ``trainlib`` and runs the
script as a user would: ``python script.py``, so the Tuner starts and closes its own cluster.
"""

from __future__ import annotations

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
