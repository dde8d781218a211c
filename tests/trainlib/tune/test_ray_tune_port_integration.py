"""A Ray Tune + Ray Train search runs on trainlib with only the imports swapped.

RAY_EXAMPLE is written the way Ray's "Hyperparameter Tuning with Ray Tune" guide tunes a
``TorchTrainer``: ``Tuner(trainer, param_space={"train_loop_config": {...}},
tune_config=tune.TuneConfig(...))``, a tiny regression instead of a dataset to download. The
test swaps ``ray.tune`` for ``trainlib.tune`` and ``ray.train`` for ``trainlib`` and runs the
script as a user would: ``python script.py``, so the Tuner starts and closes its own cluster.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.helpers import run_script_for_result, trainlib_processes

RAY_EXAMPLE = """
import json
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


# Ray Tune's "How to Define Stopping Criteria for a Ray Tune Experiment" guide, its code
# (doc/source/tune/doc_code/stopping.py), as written there: a dict, a function and a Stopper
# with stop_all as RunConfig(stop=...), FailureConfig(fail_fast=True), AsyncHyperBandScheduler,
# stop={"time_total_s": 5} and TuneConfig(time_budget_s=5.0), with Ray's own asserts.
RAY_STOPPING_GUIDE = """
# flake8: noqa

# fmt: off
# __stopping_example_trainable_start__
from ray import train


def my_trainable(config):
    i = 1
    while True:
        # Do some training...
        time.sleep(1)

        # Report some metrics for demonstration...
        train.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1
# __stopping_example_trainable_end__
# fmt: on


def my_trainable(config):
    # NOTE: This re-defines the training loop with the sleep removed for faster testing.
    i = 1
    # Training won't finish unless one of the stopping criteria is met!
    while True:
        # Do some training, and report some metrics for demonstration...
        train.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1


# __stopping_dict_start__
from ray import train, tune

tuner = tune.Tuner(
    my_trainable,
    run_config=train.RunConfig(stop={"training_iteration": 10, "mean_accuracy": 0.8}),
)
result_grid = tuner.fit()
# __stopping_dict_end__

final_iter = result_grid[0].metrics["training_iteration"]
assert final_iter == 8, final_iter

# __stopping_fn_start__
from ray import train, tune


def stop_fn(trial_id: str, result: dict) -> bool:
    return result["mean_accuracy"] >= 0.8 or result["training_iteration"] >= 10


tuner = tune.Tuner(my_trainable, run_config=train.RunConfig(stop=stop_fn))
result_grid = tuner.fit()
# __stopping_fn_end__

final_iter = result_grid[0].metrics["training_iteration"]
assert final_iter == 8, final_iter

# __stopping_cls_start__
from ray import train, tune
from ray.tune import Stopper


class CustomStopper(Stopper):
    def __init__(self):
        self.should_stop = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        if not self.should_stop and result["mean_accuracy"] >= 0.8:
            self.should_stop = True
        return self.should_stop

    def stop_all(self) -> bool:
        \"\"\"Returns whether to stop trials and prevent new ones from starting.\"\"\"
        return self.should_stop


stopper = CustomStopper()
tuner = tune.Tuner(
    my_trainable,
    run_config=train.RunConfig(stop=stopper),
    tune_config=tune.TuneConfig(num_samples=2),
)
result_grid = tuner.fit()
# __stopping_cls_end__

for result in result_grid:
    final_iter = result.metrics.get("training_iteration", 0)
    assert final_iter <= 8, final_iter

# __stopping_on_trial_error_start__
from ray import train, tune
import time


def my_failing_trainable(config):
    if config["should_fail"]:
        raise RuntimeError("Failing (on purpose)!")
    # Do some training...
    time.sleep(10)
    train.report({"mean_accuracy": 0.9})


tuner = tune.Tuner(
    my_failing_trainable,
    param_space={"should_fail": tune.grid_search([True, False])},
    run_config=train.RunConfig(failure_config=train.FailureConfig(fail_fast=True)),
)
result_grid = tuner.fit()
# __stopping_on_trial_error_end__

for result in result_grid:
    # Should never get to report
    final_iter = result.metrics.get("training_iteration")
    assert not final_iter, final_iter

# __early_stopping_start__
from ray import train, tune
from ray.tune.schedulers import AsyncHyperBandScheduler


scheduler = AsyncHyperBandScheduler(time_attr="training_iteration")

tuner = tune.Tuner(
    my_trainable,
    run_config=train.RunConfig(stop={"training_iteration": 10}),
    tune_config=tune.TuneConfig(
        scheduler=scheduler, num_samples=2, metric="mean_accuracy", mode="max"
    ),
)
result_grid = tuner.fit()
# __early_stopping_end__


def my_trainable(config):
    # NOTE: Introduce the sleep again for the time-based unit-tests.
    i = 1
    while True:
        time.sleep(1)
        # Do some training, and report some metrics for demonstration...
        train.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1


# __stopping_trials_by_time_start__
from ray import train, tune

tuner = tune.Tuner(
    my_trainable,
    # Stop a trial after it's run for more than 5 seconds.
    run_config=train.RunConfig(stop={"time_total_s": 5}),
)
result_grid = tuner.fit()
# __stopping_trials_by_time_end__

# Should only get ~5 reports
assert result_grid[0].metrics["training_iteration"] < 8


# __stopping_experiment_by_time_start__
from ray import tune

# Stop the entire experiment after ANY trial has run for more than 5 seconds.
tuner = tune.Tuner(my_trainable, tune_config=tune.TuneConfig(time_budget_s=5.0))
result_grid = tuner.fit()
# __stopping_experiment_by_time_end__

# Should only get ~5 reports
assert result_grid[0].metrics["training_iteration"] < 8
"""

PRINT_STOPPING_RESULT = (
    "\nimport json\n"
    'print("RESULT", json.dumps({"trials": len(result_grid), "errors": result_grid.num_errors, '
    '"iterations": result_grid[0].metrics["training_iteration"]}))\n'
)


def swap_module_imports(source: str) -> str:
    """``from ray import train, tune`` form: ``train`` is ``trainlib``, ``tune`` is
    ``trainlib.tune``."""
    source = source.replace(
        "from ray import train, tune", "import trainlib as train\nfrom trainlib import tune"
    )
    source = source.replace("from ray import train", "import trainlib as train")
    source = source.replace("from ray import tune", "from trainlib import tune")
    return source.replace("from ray.tune", "from trainlib.tune")


def run_ported(tmp_path: Path, ray_source: str, tail: str) -> dict[str, Any]:
    """Ray's text with its imports changed, then ``tail``, run as a script whose home (the
    default storage path's) is ``tmp_path``."""
    script = tmp_path / "ported.py"
    script.write_text(swap_module_imports(ray_source) + tail)
    return run_script_for_result(script, cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})


def test_ray_tune_stopping_guide_runs_with_imports_swapped(tmp_path: Path) -> None:
    """Each stop condition stops at Ray's iteration (Ray's asserts, in the script); the last
    search, on a time budget, ends its one trial without an error."""
    before = {p.pid for p in trainlib_processes()}
    result = run_ported(tmp_path, RAY_STOPPING_GUIDE, PRINT_STOPPING_RESULT)
    assert result["trials"] == 1 and result["errors"] == 0
    assert 1 <= result["iterations"] < 8
    assert {p.pid for p in trainlib_processes()} <= before


# Ray Tune's FAQ, "How can I use large datasets in Tune?" (doc/source/tune/doc_code/faq.py), as
# written there but for the dataset's size (10**5 values instead of 10**8).
RAY_HUGE_DATA = """
from ray import tune
import numpy as np


def train_func(config, num_epochs=5, data=None):
    for i in range(num_epochs):
        for sample in data:
            # ... train on sample
            pass


# Some huge dataset
data = np.random.random(size=100000)

tuner = tune.Tuner(tune.with_parameters(train_func, num_epochs=5, data=data))
tuner.fit()
"""

PRINT_HUGE_DATA_RESULT = (
    "\nimport json\n"
    "result_grid = tuner.get_results()\n"
    'print("RESULT", json.dumps({"trials": len(result_grid), "errors": result_grid.num_errors, '
    '"config": result_grid[0].config}))\n'
)


def test_ray_tune_large_data_faq_runs_with_imports_swapped(tmp_path: Path) -> None:
    """``tune.with_parameters`` hands the data to the trial without putting it in the config."""
    result = run_ported(tmp_path, RAY_HUGE_DATA, PRINT_HUGE_DATA_RESULT)
    assert result == {"trials": 1, "errors": 0, "config": {}}


# Ray Tune's "Training in Tune" function API (doc/source/tune/doc_code/trainable.py): its
# objective and its trainable that returns the final metrics, as written there (the sections
# that report run elsewhere here), run with the Tuner line of the section before it.
RAY_FUNCTION_API = """
# flake8: noqa

# fmt: off
# __example_objective_start__
def objective(x, a, b):
    return a * (x ** 0.5) + b
# __example_objective_end__
# fmt: on

from ray import train, tune

# fmt: off
# __function_api_return_final_metrics_start__
def trainable(config: dict):
    final_score = 0
    for x in range(20):
        final_score = objective(x, config["a"], config["b"])

    return {"score": final_score}  # This sends the score to Tune.
# __function_api_return_final_metrics_end__
# fmt: on
"""

PRINT_SCORE_RESULT = (
    "\nimport json\n"
    "result = results[0]\n"
    'print("RESULT", json.dumps({"score": result.metrics["score"], '
    '"iteration": result.metrics["training_iteration"], "errors": results.num_errors}))\n'
)
RUN_RETURNED_AND_PRINT = (
    '\ntuner = tune.Tuner(trainable, param_space={"a": 2, "b": 4})\nresults = tuner.fit()\n'
    + PRINT_SCORE_RESULT
)


def test_ray_tune_function_api_returned_dict_is_the_final_result(tmp_path: Path) -> None:
    result = run_ported(tmp_path, RAY_FUNCTION_API, RUN_RETURNED_AND_PRINT)
    assert result == {"score": 2 * 19**0.5 + 4, "iteration": 1, "errors": 0}


# The same page's class API example (doc/source/tune/doc_code/trainable.py), as written there.
RAY_CLASS_API = """
def objective(x, a, b):
    return a * (x ** 0.5) + b

# __class_api_example_start__
from ray import train, tune


class Trainable(tune.Trainable):
    def setup(self, config: dict):
        # config (dict): A dict of hyperparameters
        self.x = 0
        self.a = config["a"]
        self.b = config["b"]

    def step(self):  # This is called iteratively.
        score = objective(self.x, self.a, self.b)
        self.x += 1
        return {"score": score}


tuner = tune.Tuner(
    Trainable,
    run_config=train.RunConfig(
        # Train for 20 steps
        stop={"training_iteration": 20},
        checkpoint_config=train.CheckpointConfig(
            # We haven't implemented checkpointing yet. See below!
            checkpoint_at_end=False
        ),
    ),
    param_space={"a": 2, "b": 4},
)
results = tuner.fit()
# __class_api_example_end__
"""


def test_ray_tune_class_api_example_runs_with_imports_swapped(tmp_path: Path) -> None:
    """A tune.Trainable stepped until stop={"training_iteration": 20}: its 20th result last."""
    result = run_ported(tmp_path, RAY_CLASS_API, PRINT_SCORE_RESULT)
    assert result == {"score": 2 * 19**0.5 + 4, "iteration": 20, "errors": 0}


# Ray Tune's "A Guide to Population Based Training with Tune"
# (doc/source/tune/examples/pbt_guide.ipynb): its function API section as written there, but
# for the sizes (2 trials instead of 4, 10 iterations instead of 50), the download (a small
# stand-in for ray.tune.examples.mnist_pytorch, below) and the storage path (this test's); the
# `ray.init()` cell is left out. The "Checking the accuracy" cell follows, less its plotting.
RAY_PBT_GUIDE = """
import json
import os
import tempfile

import torch
import torch.optim as optim

import ray
from ray import train, tune
from ray.train import Checkpoint
from ray.tune.examples.mnist_pytorch import ConvNet, get_data_loaders, test_func
from ray.tune.schedulers import PopulationBasedTraining


def train_convnet(config):
    # Create our data loaders, model, and optmizer.
    step = 1
    train_loader, test_loader = get_data_loaders()
    model = ConvNet()
    optimizer = optim.SGD(
        model.parameters(),
        lr=config.get("lr", 0.01),
        momentum=config.get("momentum", 0.9),
    )

    # If `train.get_checkpoint()` is populated, then we are resuming from a checkpoint.
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            checkpoint_dict = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))

        # Load model state and iteration step from checkpoint.
        model.load_state_dict(checkpoint_dict["model_state_dict"])
        # Load optimizer state (needed since we're using momentum),
        # then set the `lr` and `momentum` according to the config.
        optimizer.load_state_dict(checkpoint_dict["optimizer_state_dict"])
        for param_group in optimizer.param_groups:
            if "lr" in config:
                param_group["lr"] = config["lr"]
            if "momentum" in config:
                param_group["momentum"] = config["momentum"]

        # Note: Make sure to increment the checkpointed step by 1 to get the current step.
        last_step = checkpoint_dict["step"]
        step = last_step + 1

    while True:
        ray.tune.examples.mnist_pytorch.train_func(model, optimizer, train_loader)
        acc = test_func(model, test_loader)
        metrics = {"mean_accuracy": acc, "lr": config["lr"]}

        # Every `checkpoint_interval` steps, checkpoint our current state.
        if step % config["checkpoint_interval"] == 0:
            with tempfile.TemporaryDirectory() as tmpdir:
                torch.save(
                    {
                        "step": step,
                        "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict(),
                    },
                    os.path.join(tmpdir, "checkpoint.pt"),
                )
                train.report(metrics, checkpoint=Checkpoint.from_directory(tmpdir))
        else:
            train.report(metrics)

        step += 1


perturbation_interval = 5
scheduler = PopulationBasedTraining(
    time_attr="training_iteration",
    perturbation_interval=perturbation_interval,
    metric="mean_accuracy",
    mode="max",
    hyperparam_mutations={
        # distribution for resampling
        "lr": tune.uniform(0.0001, 1),
        # allow perturbations within this set of categorical values
        "momentum": [0.8, 0.9, 0.99],
    },
)

tuner = tune.Tuner(
    train_convnet,
    run_config=train.RunConfig(
        name="pbt_test",
        # Stop when we've reached a threshold accuracy, or a maximum
        # training_iteration, whichever comes first
        stop={"mean_accuracy": 0.96, "training_iteration": 10},
        checkpoint_config=train.CheckpointConfig(
            checkpoint_score_attribute="mean_accuracy",
            num_to_keep=4,
        ),
        storage_path="/tmp/ray_results",
    ),
    tune_config=tune.TuneConfig(
        scheduler=scheduler,
        num_samples=2,
    ),
    param_space={
        "lr": tune.uniform(0.001, 1),
        "momentum": tune.uniform(0.001, 1),
        "checkpoint_interval": perturbation_interval,
    },
)

results_grid = tuner.fit()

import json
import os

# Get the best trial result
best_result = results_grid.get_best_result(metric="mean_accuracy", mode="max")

# Print `path` where checkpoints are stored
print('Best result path:', best_result.path)

# Print the best trial `config` reported at the last iteration
# NOTE: This config is just what the trial ended up with at the last iteration.
# See the next section for replaying the entire history of configs.
print("Best final iteration hyperparameter config:\\n", best_result.config)

# Plot the learning curve for the best trial
df = best_result.metrics_dataframe
# Deduplicate, since PBT might introduce duplicate data
df = df.drop_duplicates(subset="training_iteration", keep="last")
"""

# What ray.tune.examples.mnist_pytorch gives the guide, at the size of the data here (the
# example downloads MNIST): a model, loaders of 64 noisy samples, a train and a test step.
MNIST_STAND_IN = """
import torch
from torch import nn


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x)


def get_data_loaders():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = torch.randint(0, 2, (64,), generator=generator)  # noise: accuracy stays below 0.96
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    return loader, loader


def train_func(model, optimizer, train_loader):
    for x, y in train_loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def test_func(model, data_loader):
    with torch.no_grad():
        pairs = [(model(x).argmax(1) == y).float() for x, y in data_loader]
    return torch.cat(pairs).mean().item()
"""

PRINT_PBT_RESULT = (
    "\nimport json\n"
    'print("RESULT", json.dumps({"trials": len(results_grid), '
    '"errors": results_grid.num_errors, "config": best_result.config, '
    '"iterations": [r.metrics_dataframe["training_iteration"].tolist() for r in results_grid], '
    '"deduplicated": df["training_iteration"].tolist(), "path": best_result.path}))\n'
)


def test_ray_tune_pbt_guide_runs_with_imports_swapped(tmp_path: Path) -> None:
    """Two trials to the 10th iteration (the stop dict), each perturbed at the 5th when below
    the other; every decision logged as Ray logs it; the best config one PBT may give."""
    (tmp_path / "mnist_stand_in.py").write_text(MNIST_STAND_IN)
    source = (
        RAY_PBT_GUIDE.replace("import ray\n", "")
        .replace("from ray.tune.examples.mnist_pytorch", "from mnist_stand_in")
        .replace("test_func\n", "test_func, train_func\n", 1)
        .replace("ray.tune.examples.mnist_pytorch.train_func", "train_func")
        .replace("from ray.train import", "from trainlib import")
        .replace("/tmp/ray_results", str(tmp_path / "ray_results"))
    )
    result = run_ported(tmp_path, source, PRINT_PBT_RESULT)
    assert result["trials"] == 2 and result["errors"] == 0
    assert result["iterations"] == [list(range(1, 11))] * 2  # its own count, exploited or not
    assert result["deduplicated"] == list(range(1, 11))
    assert set(result["config"]) == {"lr", "momentum", "checkpoint_interval"}
    assert Path(result["path"]).parent == tmp_path / "ray_results" / "pbt_test"
    decisions = tmp_path / "ray_results" / "pbt_test" / "pbt_global.txt"
    for line in decisions.read_text().splitlines() if decisions.exists() else []:
        trial, donor, iteration, _, donor_config, new_config = json.loads(line)
        assert trial != donor and iteration == 5
        assert new_config["checkpoint_interval"] == donor_config["checkpoint_interval"] == 5
        assert new_config["momentum"] in (0.8, 0.9, 0.99)


# Ray AIR's "Tuning with Ray Tune" (doc/source/ray-air/doc_code/tuner.py): its TorchTrainer
# section, its Tuner and its result inspection, as written there but for the size (2 epochs
# instead of 10); the linear example it imports is a small stand-in (below) that also reports
# the size of its group.
RAY_TUNE_TRIAL_SIZES = """
from ray import tune
from ray.air.config import ScalingConfig

# __torch_start__
from ray import tune
from ray.air.examples.pytorch.torch_linear_example import (
    train_func as linear_train_func,
)
from ray.train.torch import TorchTrainer

trainer = TorchTrainer(
    train_loop_per_worker=linear_train_func,
    train_loop_config={"lr": 1e-2, "batch_size": 4, "epochs": 2},
    scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
)

param_space = {
    # The params will be merged with the ones defined in the TorchTrainer
    "train_loop_config": {
        # This is a parameter that hasn't been set in the TorchTrainer
        "hidden_size": tune.randint(1, 4),
        # This will overwrite whatever was set when TorchTrainer was instantiated
        "batch_size": tune.choice([4, 8]),
    },
    # We can also tune the number of distributed workers
    "scaling_config": ScalingConfig(num_workers=tune.grid_search([1, 2])),
}
# __torch_end__

# __tuner_start__
from ray.air.config import RunConfig
from ray.tune.tuner import Tuner, TuneConfig

tuner = Tuner(
    trainable=trainer,
    run_config=RunConfig(name="test_tuner"),
    param_space=param_space,
    tune_config=TuneConfig(mode="min", metric="loss", num_samples=2),
)
result_grid = tuner.fit()
# __tuner_end__


# __result_grid_inspection_start__

# Number of results
num_results = len(result_grid)

# Check if there have been errors
if result_grid.errors:
    print("At least one trial failed.")

# Get the best result
best_result = result_grid.get_best_result()

# And the best checkpoint
best_checkpoint = best_result.checkpoint

# And the best metrics
best_metric = best_result.metrics

# Inspect all results
for result in result_grid:
    if result.error:
        print("The trial had an error:", result.error)
        continue

    print("The trial finished successfully with the metrics:", result.metrics)
# __result_grid_inspection_end__
"""

LINEAR_STAND_IN = """
import torch
from torch import nn

import trainlib
from trainlib.torch import prepare_model


def train_func(config):
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = 2 * x + 1
    model = prepare_model(
        nn.Sequential(nn.Linear(1, config["hidden_size"]), nn.Linear(config["hidden_size"], 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for _ in range(config["epochs"]):
        for start in range(0, 32, config["batch_size"]):
            batch = slice(start, start + config["batch_size"])
            loss = nn.functional.mse_loss(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        world_size = trainlib.get_context().get_world_size()
        trainlib.report({"loss": loss.item(), "world_size": world_size})
"""

PRINT_SIZES = (
    "\nimport json\n"
    'print("RESULT", json.dumps({"trials": num_results, "errors": len(result_grid.errors), '
    '"sizes": sorted((r.config["scaling_config"].num_workers, r.metrics["world_size"]) '
    "for r in result_grid)}))\n"
)


def test_ray_air_tuner_searches_trial_sizes_with_imports_swapped(tmp_path: Path) -> None:
    """param_space["scaling_config"] with tune.grid_search([1, 2]): each trial runs on the
    number of ranks it was given (2 samples of each size; ASHA may stop some early)."""
    package = tmp_path / "examples"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "torch_linear_stand_in.py").write_text(LINEAR_STAND_IN)
    source = RAY_TUNE_TRIAL_SIZES.replace(
        "ray.air.examples.pytorch.torch_linear_example", "examples.torch_linear_stand_in"
    ).replace("ray.air", "trainlib.air")
    result = run_ported(tmp_path, swap_imports(source), PRINT_SIZES)
    assert result["trials"] == 4 and result["errors"] == 0
    assert result["sizes"] == [[1, 1], [1, 1], [2, 2], [2, 2]]
