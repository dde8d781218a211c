"""Search space helpers: Ray's names become Optuna distributions; grids and constants."""

from __future__ import annotations

import optuna.distributions as dist
import pytest

from trainlib import ConfigError, tune
from trainlib.tune.search_space import flatten


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
    with pytest.raises(ConfigError, match="time_attr='training_iteration'"):
        tune.ASHAScheduler(time_attr="time_total_s")
