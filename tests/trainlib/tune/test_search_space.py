"""Search space helpers: Ray's names become Optuna distributions; grids and constants."""

from __future__ import annotations

import statistics

import optuna.distributions as dist
import pytest

from trainlib import ConfigError, tune
from trainlib.tune.flat_space import flatten


def test_search_space_helpers_map_to_optuna_distributions() -> None:
    space = flatten(
        {
            "lr": tune.loguniform(1e-4, 1e-1),
            "momentum": tune.uniform(0.1, 0.9),
            "dropout": tune.quniform(0.0, 0.5, 0.1),
            "layers": tune.randint(1, 4),
            "model": tune.choice(["cnn", "resnet"]),
        }
    ).distributions()
    assert space["lr"] == dist.FloatDistribution(1e-4, 1e-1, log=True)
    assert space["momentum"] == dist.FloatDistribution(0.1, 0.9)
    assert space["dropout"] == dist.FloatDistribution(0.0, 0.5, step=0.1)
    assert space["layers"] == dist.IntDistribution(1, 3)  # Ray's randint excludes the upper bound
    assert space["model"] == dist.CategoricalDistribution(("cnn", "resnet"))


def test_search_space_nested_paths_grid_points_and_constants() -> None:
    space = flatten(
        {
            "train_loop_config": {
                "lr": tune.uniform(0.0, 1.0),
                "batch_size": tune.grid_search([32, 64]),
                "model": tune.grid_search(["a", "b"]),
                "epochs": 3,
            }
        }
    )
    assert set(space.domains) == {"train_loop_config/lr"}
    assert len(space.grid_points()) == 4
    assert space.config({"train_loop_config/lr": 0.5, "train_loop_config/batch_size": 32}) == {
        "train_loop_config": {"lr": 0.5, "batch_size": 32, "epochs": 3}
    }


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tune.loguniform(0, 1), "lower > 0"),
        (lambda: tune.uniform(1, 1), "upper > lower"),
        (lambda: tune.randint(3, 3), "upper is excluded"),
        (lambda: tune.choice([]), "at least one"),
        (lambda: tune.grid_search([]), "at least one"),
        (lambda: tune.quniform(0, 1, 0), "q > 0"),
    ],
)
def test_search_space_bad_bounds_say_what_to_give(make: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()  # type: ignore[operator]


def test_tune_config_takes_metric_and_mode_together_or_neither() -> None:
    for half in ({"metric": "loss"}, {"mode": "min"}, {"metric": "", "mode": "min"}):
        with pytest.raises(ConfigError, match=r"needs both .*or neither"):
            tune.TuneConfig(num_samples=2, **half)  # type: ignore[arg-type]
    plain = tune.TuneConfig(num_samples=2)  # Ray's default: trials run, not compared
    assert isinstance(plain.scheduler, tune.FIFOScheduler)
    assert isinstance(plain.searcher, tune.BasicVariantGenerator)
    compared = tune.TuneConfig(metric="loss", mode="min")  # Ray's default: no trial stopped
    assert isinstance(compared.scheduler, tune.FIFOScheduler)
    with pytest.raises(ConfigError, match="stops trials on a metric"):
        tune.TuneConfig(scheduler=tune.ASHAScheduler(max_t=5))
    with pytest.raises(ConfigError, match="learns from a metric"):
        tune.TuneConfig(search_alg=tune.OptunaSearch())
    with pytest.raises(ConfigError, match="num_samples=0"):
        tune.TuneConfig(num_samples=0)


def test_schedulers_map_to_optuna_pruners() -> None:
    import optuna

    assert isinstance(tune.ASHAScheduler().optuna_pruner(), optuna.pruners.SuccessiveHalvingPruner)
    assert isinstance(tune.HyperBandScheduler().optuna_pruner(), optuna.pruners.HyperbandPruner)
    assert isinstance(tune.MedianStoppingRule().optuna_pruner(), optuna.pruners.MedianPruner)
    assert isinstance(tune.OptunaSearch().optuna_sampler(), optuna.samplers.TPESampler)
    assert isinstance(tune.BasicVariantGenerator().optuna_sampler(), optuna.samplers.RandomSampler)
    assert tune.ASHAScheduler(time_attr="time_total_s").time_attr == "time_total_s"  # Ray's
    with pytest.raises(ConfigError, match="must name an increasing result"):
        tune.ASHAScheduler(time_attr="")


# Ray Tune's "Search Space API" (doc/source/tune/api/search_space.rst), its example config as
# written there: each function's documented range, rounding and bounds, over Optuna's samples.
RAY_SEARCH_SPACE = {
    "uniform": tune.uniform(-5, -1),  # Uniform float between -5 and -1
    "quniform": tune.quniform(3.2, 5.4, 0.2),  # Round to multiples of 0.2
    "loguniform": tune.loguniform(1e-4, 1e-1),  # Uniform float in log space
    "qloguniform": tune.qloguniform(1e-4, 1e-1, 5e-5),  # Round to multiples of 0.00005
    "randn": tune.randn(10, 2),  # Normal distribution with mean 10 and sd 2
    "qrandn": tune.qrandn(10, 2, 0.2),  # Round to multiples of 0.2
    "randint": tune.randint(-9, 15),  # Random integer between -9 and 15
    "qrandint": tune.qrandint(-21, 12, 3),  # Round to multiples of 3 (includes 12)
    # Random integer between 1 and 10 in log space
    "lograndint": tune.lograndint(1, 10),
    "qlograndint": tune.qlograndint(1, 10, 2),  # Round to multiples of 2 (includes 10)
    "choice": tune.choice(["a", "b", "c"]),  # Choose one of these options uniformly
    # Depends on other value
    "func": tune.sample_from(lambda spec: spec.config.uniform * 0.01),
    "grid": tune.grid_search([32, 64, 128]),  # Search over all these values
}


def multiple_of(value: float, q: float) -> bool:
    return abs(value / q - round(value / q)) < 1e-6


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_search_space_rays_example_samples_as_ray_documents(sampler: str) -> None:
    import optuna

    space = flatten(RAY_SEARCH_SPACE)
    distributions = space.distributions()
    make = optuna.samplers.RandomSampler if sampler == "random" else optuna.samplers.TPESampler
    study = optuna.create_study(sampler=make(seed=0))
    configs = []
    for _ in range(400 if sampler == "random" else 60):
        trial = study.ask(distributions)
        configs.append(space.config(trial.params, f"trial_{trial.number:05d}"))
        study.tell(trial, 0.0)
    column = {key: [c[key] for c in configs] for key in RAY_SEARCH_SPACE}
    assert all(-5 <= v <= -1 for v in column["uniform"])
    assert all(3.2 <= v <= 5.4 + 1e-9 and multiple_of(v, 0.2) for v in column["quniform"])
    assert all(1e-4 <= v <= 1e-1 for v in column["loguniform"])
    assert all(1e-4 <= v <= 1e-1 and multiple_of(v, 5e-5) for v in column["qloguniform"])
    assert all(multiple_of(v, 0.2) for v in column["qrandn"])
    assert all(isinstance(v, int) and -9 <= v < 15 for v in column["randint"])
    assert all(isinstance(v, int) and -21 <= v <= 12 and v % 3 == 0 for v in column["qrandint"])
    assert all(isinstance(v, int) and 1 <= v < 10 for v in column["lograndint"])
    assert all(isinstance(v, int) and 0 <= v <= 10 and v % 2 == 0 for v in column["qlograndint"])
    assert set(column["choice"]) <= {"a", "b", "c"}
    assert set(column["grid"]) <= {32, 64, 128}
    assert all(c["func"] == c["uniform"] * 0.01 for c in configs)
    if sampler == "random":  # the distributions themselves
        normal = column["randn"]
        assert abs(statistics.mean(normal) - 10) < 0.5
        assert 1.6 < statistics.stdev(normal) < 2.4
        assert 12 in column["qrandint"] and 10 in column["qlograndint"]  # upper bounds included
        assert sum(v < 10**-2.5 for v in column["loguniform"]) > 100  # half below the log midpoint


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tune.qloguniform(0, 1, 0.1), "lower > 0 and q > 0"),
        (lambda: tune.randn(0, 0), "sd > 0"),
        (lambda: tune.qrandn(0, 1, 0), "q > 0"),
        (lambda: tune.qrandint(0, 10, 0), "q >= 1"),
        (lambda: tune.lograndint(0, 10), "1 <= lower"),
        (lambda: tune.qlograndint(5, 5, 1), "1 <= lower < upper"),
    ],
)
def test_search_space_rays_other_functions_say_what_to_give(make: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()  # type: ignore[operator]


def test_search_space_with_parameters_passes_objects_besides_the_config() -> None:
    def train_func(config, num_epochs=5, data=None):  # type: ignore[no-untyped-def]
        return config["lr"], num_epochs, len(data)

    wrapped = tune.with_parameters(train_func, num_epochs=2, data=[1, 2, 3])
    assert wrapped({"lr": 0.1}) == (0.1, 2, 3)
    with_both = tune.with_resources(wrapped, {"cpu": 1})
    assert with_both({"lr": 0.2}) == (0.2, 2, 3)
    other_way = tune.with_parameters(tune.with_resources(train_func, {"cpu": 1}), data=[1])
    assert isinstance(other_way, type(with_both)) and other_way({"lr": 0.3}) == (0.3, 5, 1)
    with pytest.raises(ConfigError, match="cannot take them"):
        tune.with_parameters(train_func, dataset=[1])


def test_search_space_sample_from_is_the_same_for_a_trial_made_again() -> None:
    """A random sample_from gives a resumed or restored trial (same name, same parameters)
    the value it had, and other trials other values; the global generators are put back."""
    import random

    import numpy as np

    space = flatten(
        {
            "lr": tune.uniform(0, 1),
            "nested": {"seed": tune.sample_from(lambda _: np.random.randint(10**9))},
            "noise": tune.sample_from(lambda spec: spec.config.nested.seed + random.random()),
        }
    )
    state = random.getstate()
    first = space.config({"lr": 0.5}, "trial_00001")
    assert random.getstate() == state
    assert space.config({"lr": 0.5}, "trial_00001") == first
    assert space.config({"lr": 0.5}, "trial_00002")["nested"] != first["nested"]
    assert first["noise"] - first["nested"]["seed"] < 1
    with pytest.raises(AttributeError, match="has no 'later'"):
        flatten({"x": tune.sample_from(lambda spec: spec.config.later)}).config({}, "t")
