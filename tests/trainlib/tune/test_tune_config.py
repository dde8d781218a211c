"""TuneConfig with Ray's other places for its settings: metric and mode on the searcher or
the scheduler, a ConcurrencyLimiter's cap, BayesOptSearch as Optuna's GPSampler; and
ResultGrid.get_dataframe's filter."""

from __future__ import annotations

import optuna
import pytest
from fsspec.implementations.local import LocalFileSystem

from trainlib import ConfigError, Result, tune
from trainlib.tune.flat_space import flatten
from trainlib.tune.schedulers.hb_bohb import HyperBandForBOHB
from trainlib.tune.search import BayesOptSearch, ConcurrencyLimiter, OptunaSearch
from trainlib.tune.search.bayesopt import BayesOptSearch as AtRaysPath
from trainlib.tune.search.bohb import TuneBOHB
from trainlib.tune.search.hyperopt import HyperOptSearch
from trainlib.tune.tune_config import TuneConfig


def test_tune_config_takes_metric_and_mode_from_the_searcher_or_the_scheduler() -> None:
    by_searcher = TuneConfig(search_alg=OptunaSearch(metric="loss", mode="min"))
    assert (by_searcher.metric, by_searcher.mode) == ("loss", "min")
    by_scheduler = TuneConfig(scheduler=tune.HyperBandScheduler(metric="acc", mode="max"))
    assert (by_scheduler.metric, by_scheduler.mode) == ("acc", "max")
    both = TuneConfig(  # the same in both places, as Ray's HyperOpt page writes them
        metric="loss", mode="min", search_alg=HyperOptSearch(metric="loss", mode="min")
    )
    assert (both.metric, both.mode) == ("loss", "min")
    with pytest.raises(ConfigError, match="the same ones, or in one place only"):
        TuneConfig(
            metric="loss", mode="min", scheduler=tune.ASHAScheduler(metric="loss", mode="max")
        )


def test_hyperopt_and_bohb_are_optunas_tpe_and_hyperband() -> None:
    """Ray's HyperOptSearch, TuneBOHB and HyperBandForBOHB at Ray's paths: Optuna's TPE with
    HyperOpt's settings, multivariate TPE and Hyperband; what they cannot take is named."""
    hyperopt = HyperOptSearch(
        metric="loss",
        mode="min",
        n_initial_points=5,
        random_state_seed=7,
        points_to_evaluate=[{"lr": 0.1}],
    )
    sampler = hyperopt.optuna_sampler()
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert sampler._n_startup_trials == 5 and sampler._n_ei_candidates == 24
    assert TuneConfig(search_alg=hyperopt).searcher.points_to_evaluate == [{"lr": 0.1}]
    bohb = TuneBOHB(metric="loss", mode="min", seed=3).optuna_sampler()
    assert isinstance(bohb, optuna.samplers.TPESampler) and bohb._multivariate
    pruner = HyperBandForBOHB(max_t=9, reduction_factor=3).optuna_pruner()
    assert isinstance(pruner, optuna.pruners.HyperbandPruner)
    config = TuneConfig(search_alg=TuneBOHB(), scheduler=HyperBandForBOHB(metric="acc", mode="max"))
    assert (config.metric, config.mode) == ("acc", "max")
    with pytest.raises(ConfigError, match=r"hp\.\* expressions is not taken"):
        HyperOptSearch({"lr": object()})
    with pytest.raises(ConfigError, match="ConfigSpace is not taken"):
        TuneBOHB(space={"lr": (0, 1)})
    with pytest.raises(ConfigError, match="ConcurrencyLimiter"):
        TuneBOHB(max_concurrent=4)


def test_tune_config_concurrency_limiter_caps_the_trials_at_once() -> None:
    limited = ConcurrencyLimiter(OptunaSearch(metric="loss", mode="min"), max_concurrent=2)
    assert TuneConfig(search_alg=limited).concurrency == 2
    assert TuneConfig(search_alg=limited, max_concurrent_trials=1).concurrency == 1
    assert TuneConfig(search_alg=limited).metric == "loss"  # the wrapped searcher's
    assert TuneConfig(metric="loss", mode="min").concurrency is None
    with pytest.raises(ConfigError, match="batch=True"):
        ConcurrencyLimiter(OptunaSearch(), max_concurrent=2, batch=True)
    with pytest.raises(ConfigError, match=">= 1"):
        ConcurrencyLimiter(OptunaSearch(), max_concurrent=0)


def test_tune_config_bayesopt_search_proposes_with_a_gaussian_process() -> None:
    searcher = AtRaysPath(utility_kwargs={"kind": "ucb", "kappa": 2.5, "xi": 0.0})
    assert searcher is not None and isinstance(searcher, BayesOptSearch)
    sampler = searcher.optuna_sampler()
    assert isinstance(sampler, optuna.samplers.GPSampler)
    space = flatten({"width": tune.uniform(0, 20), "height": tune.uniform(-100, 100)})
    study = optuna.create_study(sampler=BayesOptSearch(random_search_steps=3).optuna_sampler())
    for _ in range(6):  # 3 at random, then the Gaussian process's proposals
        trial = study.ask(space.distributions())
        config = space.config(trial.params)
        study.tell(trial, (config["width"] - 5) ** 2 + config["height"] * 0.1)
    assert len(study.trials) == 6
    # Ray's BayesOptSearch(space={name: (low, high)}) joins the Tuner's param_space
    bounded = BayesOptSearch(space={"width": (0, 20)}, points_to_evaluate=[{"width": 5.0}])
    assert bounded.optuna_space() == {"width": optuna.distributions.FloatDistribution(0.0, 20.0)}
    assert bounded.points_to_evaluate == [{"width": 5.0}]
    with pytest.raises(ConfigError, match=r"\(low, high\), low < high"):
        BayesOptSearch(space={"width": (20, 0)})


def _result(history: list[dict[str, float]]) -> Result:
    return Result(
        metrics=history[-1],
        checkpoint=None,
        best_checkpoints=[],
        path="/x/trial_00000",
        filesystem=LocalFileSystem(),
        metrics_history=history,
        config={"lr": 0.1},
    )


def test_tune_config_result_grid_dataframe_filters_each_trials_best_report() -> None:
    trial = _result([{"loss": 3.0}, {"loss": 1.0}, {"loss": 2.0}])
    grid = tune.ResultGrid([trial], ["complete"], experiment_path="/x", metric=None, mode=None)
    assert grid.get_dataframe()["loss"].tolist() == [2.0]  # the last report
    best = grid.get_dataframe(filter_metric="loss", filter_mode="min")
    assert best["loss"].tolist() == [1.0] and best["training_iteration"].tolist() == [2]
    assert grid.get_dataframe(filter_metric="loss", filter_mode="max")["loss"].tolist() == [3.0]
    with pytest.raises(ConfigError, match="needs both"):
        grid.get_dataframe(filter_metric="loss")
