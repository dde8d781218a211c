"""Ray Tune's "Running Tune experiments with Optuna" by import swap: OptunaSearch with
points_to_evaluate, a dict of Optuna distributions as its space, and a define-by-run space that
returns constants (doc/source/tune/examples/optuna_example.ipynb), then Ray's HyperOpt
example with points to evaluate (hyperopt_example.ipynb); sizes cut for 2 CPUs:
3 steps a trial instead of 100, no sleep; ``import ray`` and ``ray.init`` left out)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.helpers import trainlib_processes
from tests.trainlib.tune.test_ray_tune_port_integration import run_ported
from trainlib import ConfigError
from trainlib.tune.search import ConcurrencyLimiter, OptunaSearch

RAY_OPTUNA_EXAMPLE = """
from typing import Any, Dict, Optional

import optuna
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch


def evaluate(step, width, height, activation):
    activation_boost = 10 if activation == "relu" else 0
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 + activation_boost


def objective(config):
    for step in range(config["steps"]):
        score = evaluate(step, config["width"], config["height"], config["activation"])
        tune.report({"iterations": step, "mean_loss": score})


search_space = {
    "steps": 3,
    "width": tune.uniform(0, 20),
    "height": tune.uniform(-100, 100),
    "activation": tune.choice(["relu", "tanh"]),
}

initial_params = [
    {"width": 1, "height": 2, "activation": "relu"},
    {"width": 4, "height": 2, "activation": "relu"},
]
searcher = OptunaSearch(points_to_evaluate=initial_params)
algo = ConcurrencyLimiter(searcher, max_concurrent=2)
tuner = tune.Tuner(
    objective,
    tune_config=tune.TuneConfig(
        metric="mean_loss", mode="min", search_alg=algo, num_samples=3,
    ),
    param_space=search_space,
)
results = tuner.fit()
first = sorted((r.config for r in results), key=lambda c: (c["width"], c["height"]))


def define_by_run_func(trial) -> Optional[Dict[str, Any]]:
    activation = trial.suggest_categorical("activation", ["relu", "tanh"])
    trial.suggest_float("width", 0, 20)
    trial.suggest_float("height", -100, 100)
    if activation == "relu":
        trial.suggest_float("mult", 1, 2)
    return {"steps": 3}


searcher = OptunaSearch(space=define_by_run_func, metric="mean_loss", mode="min")
tuner = tune.Tuner(objective, tune_config=tune.TuneConfig(search_alg=searcher, num_samples=3))
defined = [r.config for r in tuner.fit()]

space = {
    "width": optuna.distributions.FloatDistribution(0, 20),
    "height": optuna.distributions.FloatDistribution(-100, 100),
    "activation": optuna.distributions.CategoricalDistribution(["relu", "tanh"]),
}
searcher = OptunaSearch(space, metric="mean_loss", mode="min")
tuner = tune.Tuner(
    objective,
    tune_config=tune.TuneConfig(search_alg=searcher, num_samples=2),
    param_space={"steps": 3},
)
from_dict = [r.config for r in tuner.fit()]

# Ray's HyperOpt example (doc/source/tune/examples/hyperopt_example.ipynb), the same objective
from ray.tune.search.hyperopt import HyperOptSearch

initial_params = [
    {"width": 1, "height": 2, "activation": "relu"},
    {"width": 4, "height": 2, "activation": "tanh"},
]
algo = HyperOptSearch(points_to_evaluate=initial_params)
algo = ConcurrencyLimiter(algo, max_concurrent=4)
tuner = tune.Tuner(
    objective,
    tune_config=tune.TuneConfig(
        metric="mean_loss",
        mode="min",
        search_alg=algo,
        num_samples=3,
    ),
    param_space=search_space,
)
hyperopt = [r.config for r in tuner.fit()]
"""

PRINT_RESULT = """
import json
print("RESULT", json.dumps(
    {"first": first, "defined": defined, "from_dict": from_dict, "hyperopt": hyperopt}
))
"""


def test_ray_optuna_example_runs_with_imports_swapped(tmp_path: Path) -> None:
    before = {p.pid for p in trainlib_processes()}
    result = run_ported(tmp_path, RAY_OPTUNA_EXAMPLE, PRINT_RESULT)
    first = result["first"]
    assert len(first) == 3
    # the two points to evaluate, as given, then one the searcher chose
    assert {"width": 1, "height": 2, "activation": "relu", "steps": 3} in first
    assert {"width": 4, "height": 2, "activation": "relu", "steps": 3} in first
    for config in result["defined"]:  # the function's suggestions and its constants
        assert config["steps"] == 3 and 0 <= config["width"] <= 20
        assert ("mult" in config) == (config["activation"] == "relu")
    assert len(result["defined"]) == 3
    hyperopt = result["hyperopt"]
    assert {"width": 1, "height": 2, "activation": "relu", "steps": 3} in hyperopt
    assert {"width": 4, "height": 2, "activation": "tanh", "steps": 3} in hyperopt
    assert len(hyperopt) == 3
    for config in result["from_dict"]:
        assert set(config) == {"steps", "width", "height", "activation"}
        assert -100 <= config["height"] <= 100
    assert {p.pid for p in trainlib_processes()} <= before


def test_optuna_search_refuses_what_it_cannot_take() -> None:
    with pytest.raises(ConfigError, match="give Optuna distributions"):
        OptunaSearch(space={"x": (0, 1)})
    with pytest.raises(ConfigError, match="evaluated_rewards"):
        OptunaSearch(points_to_evaluate=[{"x": 1}], evaluated_rewards=[0.5])
    with pytest.raises(ConfigError, match="one mode, 'min' or 'max', for each metric"):
        OptunaSearch(metric=["loss", "accuracy"], mode=["min"])
    wrapped = ConcurrencyLimiter(
        OptunaSearch(space={"x": optuna.distributions.FloatDistribution(0, 1)}), max_concurrent=1
    )
    assert list(wrapped.optuna_space()) == ["x"]


# Ray's "Multi-objective optimization" section of the same page, as written there but for the
# sizes (3 steps, 4 samples, no sleep).
RAY_OPTUNA_MULTI_OBJECTIVE = """
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch


def evaluate(step, width, height, activation):
    activation_boost = 10 if activation == "relu" else 0
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 + activation_boost


def multi_objective(config):
    # Hyperparameters
    width, height = config["width"], config["height"]

    for step in range(config["steps"]):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluate(step, config["width"], config["height"], config["activation"])
        # Feed the score back back to Tune.
        tune.report({
           "iterations": step, "loss": intermediate_score, "gain": intermediate_score * width
        })


search_space = {
    "steps": 3,
    "width": tune.uniform(0, 20),
    "height": tune.uniform(-100, 100),
    "activation": tune.choice(["relu", "tanh"]),
}
searcher = OptunaSearch(metric=["loss", "gain"], mode=["min", "max"])
algo = ConcurrencyLimiter(searcher, max_concurrent=4)

tuner = tune.Tuner(
    multi_objective,
    tune_config=tune.TuneConfig(
        search_alg=algo,
        num_samples=4,
    ),
    param_space=search_space
)
results = tuner.fit();

print("Best hyperparameters for loss found were: ", results.get_best_result("loss", "min").config)
print("Best hyperparameters for gain found were: ", results.get_best_result("gain", "max").config)
"""

PRINT_MULTI_OBJECTIVE = """
import json, os
print("RESULT", json.dumps({
    "path": results.experiment_path,
    "trials": [[r.config, r.metrics["loss"], r.metrics["gain"]] for r in results],
    "best_loss": results.get_best_result("loss", "min").config,
    "best_gain": results.get_best_result("gain", "max").config,
}))
"""


def test_ray_optuna_multi_objective_example_runs_with_imports_swapped(tmp_path: Path) -> None:
    """Optuna's study has Ray's two directions and holds each trial's last loss and gain; the
    best by either is the trial with the least loss or the most gain."""
    before = {p.pid for p in trainlib_processes()}
    result = run_ported(tmp_path, RAY_OPTUNA_MULTI_OBJECTIVE, PRINT_MULTI_OBJECTIVE)
    trials = result["trials"]
    assert len(trials) == 4
    assert result["best_loss"] == min(trials, key=lambda t: t[1])[0]
    assert result["best_gain"] == max(trials, key=lambda t: t[2])[0]
    path = Path(result["path"])
    study = optuna.load_study(study_name=path.name, storage=f"sqlite:///{path / 'study.db'}")
    assert study.directions == [
        optuna.study.StudyDirection.MINIMIZE,
        optuna.study.StudyDirection.MAXIMIZE,
    ]
    told = sorted(tuple(t.values) for t in study.trials if t.state.name == "COMPLETE")
    assert told == sorted((loss, gain) for _, loss, gain in trials)
    assert len(study.best_trials) >= 1  # the Pareto front Optuna keeps
    assert {p.pid for p in trainlib_processes()} <= before


# Ray's hyperopt_conditional_search_space_example.py (python/ray/tune/examples), as written there
# but for the sizes (3 steps, 4 samples), the label typo kept ("heright"); argparse, ray.init
# and the __main__ guard left out, with one point to evaluate added (Ray's label-keyed form).
RAY_HYPEROPT_CONDITIONAL = """
import time

from hyperopt import hp

from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.hyperopt import HyperOptSearch


def f_unpack_dict(dct: dict) -> dict:
    res = {}
    for k, v in dct.items():
        if isinstance(v, dict):
            res = {**res, **f_unpack_dict(v)}
        else:
            res[k] = v

    return res


def evaluation_fn(step, width, height, mult=1):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 * mult


def easy_objective(config_in):
    # Hyperparameters
    config = f_unpack_dict(config_in)
    width, height, mult = config["width"], config["height"], config.get("mult", 1)
    print(config)

    for step in range(config["steps"]):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height, mult)
        # Feed the score back back to Tune.
        tune.report({"iterations": step, "mean_loss": intermediate_score})
        time.sleep(0.1)


config_space = {
    "activation": hp.choice(
        "activation",
        [
            {"activation": "relu", "mult": hp.uniform("mult", 1, 2)},
            {"activation": "tanh"},
        ],
    ),
    "width": hp.uniform("width", 0, 20),
    "height": hp.uniform("heright", -100, 100),
    "steps": 3,
}


def run_hyperopt_tune(config_dict=config_space, smoke_test=False):
    algo = HyperOptSearch(
        space=config_dict, metric="mean_loss", mode="min",
        points_to_evaluate=[{"activation": 1, "width": 5.0, "heright": -50.0}],
    )
    algo = ConcurrencyLimiter(algo, max_concurrent=4)
    scheduler = AsyncHyperBandScheduler()
    tuner = tune.Tuner(
        easy_objective,
        tune_config=tune.TuneConfig(
            metric="mean_loss",
            mode="min",
            search_alg=algo,
            scheduler=scheduler,
            num_samples=4 if smoke_test else 100,
        ),
    )
    results = tuner.fit()
    print("Best hyperparameters found were: ", results.get_best_result().config)
    return results


results = run_hyperopt_tune(smoke_test=True)
"""

PRINT_CONDITIONAL = """
import json
print("RESULT", json.dumps({
    "configs": [r.config for r in results],
    "errors": len(results.errors),
    "best": results.get_best_result().config,
}))
"""


def test_ray_hyperopt_conditional_space_example_runs_with_imports_swapped(tmp_path: Path) -> None:
    """HyperOpt's conditional space: each config has the shape HyperOpt gives it (``mult`` only
    under relu), values in HyperOpt's ranges; the point given by labels runs first as given."""
    before = {p.pid for p in trainlib_processes()}
    result = run_ported(tmp_path, RAY_HYPEROPT_CONDITIONAL, PRINT_CONDITIONAL)
    configs = result["configs"]
    assert len(configs) == 4 and result["errors"] == 0
    assert {"activation": {"activation": "tanh"}, "width": 5.0, "height": -50.0, "steps": 3} in (
        configs
    )
    for config in configs:
        assert set(config) == {"activation", "width", "height", "steps"}
        activation = config["activation"]
        assert ("mult" in activation) == (activation["activation"] == "relu")
        assert 1 <= activation.get("mult", 1) <= 2
        assert 0 <= config["width"] <= 20 and -100 <= config["height"] <= 100
    assert result["best"] in configs
    assert {p.pid for p in trainlib_processes()} <= before
