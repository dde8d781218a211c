"""TuneConfig with Ray's other places for its settings: metric and mode on the searcher or
the scheduler, a ConcurrencyLimiter's cap, BayesOptSearch as Optuna's GPSampler; and
ResultGrid.get_dataframe's filter."""

from __future__ import annotations

import optuna
import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib import ConfigError, Result, tune
from trainlib._internal.common.storage import RunStorage
from trainlib.tune._study import StudySettings, told_values
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
    with pytest.raises(ConfigError, match=r"takes HyperOpt.s hp\.\* expressions or Optuna"):
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


def test_tune_config_multi_objective_optuna_search_as_rays() -> None:
    """Ray's ``OptunaSearch(metric=[...], mode=[...])``: one study direction per metric, the
    trials' values of each told, no TuneConfig metric (trials are not ranked)."""
    searcher = OptunaSearch(metric=["loss", "gain"], mode=["min", "max"])
    for config in (
        TuneConfig(search_alg=searcher, num_samples=4),
        TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=2)),
    ):
        assert (config.metric, config.mode) == (None, None)
        assert config.objectives == [("loss", "min"), ("gain", "max")]
    assert TuneConfig(metric="acc", mode="max").objectives == [("acc", "max")]
    assert TuneConfig().objectives == []


def test_tune_config_multi_objective_study_has_a_direction_per_metric(tmp_path) -> None:
    experiment = RunStorage.create(str(tmp_path), "search", None)
    searcher = OptunaSearch(metric=["loss", "gain", "size"], mode=["min", "max", "min"])
    settings_ = StudySettings.of(TuneConfig(search_alg=searcher), "search", experiment)
    assert settings_.directions == ["minimize", "maximize", "minimize"]
    one = StudySettings.of(TuneConfig(metric="acc", mode="min"), "search", experiment)
    assert one.directions == ["minimize"]
    assert StudySettings.of(TuneConfig(), "search", experiment).directions == ["maximize"]
    assert told_values({"loss": 1, "gain": 2.5, "x": "y"}, ["loss", "gain"]) == [1.0, 2.5]
    assert told_values({}, []) == [0.0]
    with pytest.raises(ValueError, match="without the metric 'gain'"):
        told_values({"loss": 1}, ["loss", "gain"])


def test_tune_config_multi_objective_refuses_what_ray_would_not_run() -> None:
    multi = OptunaSearch(metric=["loss", "gain"], mode=["min", "max"])
    with pytest.raises(ConfigError, match="ranks no trials"):
        TuneConfig(metric="loss", mode="min", search_alg=multi)
    with pytest.raises(ConfigError, match="multi-objective search takes FIFOScheduler only"):
        TuneConfig(search_alg=multi, scheduler=tune.ASHAScheduler())
    for one_metric in (BayesOptSearch, HyperOptSearch, TuneBOHB):
        with pytest.raises(ConfigError, match="optimises one metric"):
            one_metric(metric=["loss", "gain"], mode=["min", "max"])
    with pytest.raises(ConfigError, match="a list of modes goes with a list of metrics"):
        OptunaSearch(metric="loss", mode=["min"])  # type: ignore[arg-type]


_NAMES = st.sampled_from(["loss", "gain", "acc", "", "a/b"])
_MODES = st.sampled_from(["min", "max", "minimize", None, "MAX"])


@settings(max_examples=300, deadline=None)
@given(
    metrics=st.lists(_NAMES, max_size=4) | st.tuples(_NAMES, _NAMES),
    modes=st.none() | st.lists(_MODES, max_size=4) | st.just("min"),
)
def test_tune_config_multi_objective_metrics_and_modes_generated(metrics, modes) -> None:
    """Every list of metrics with every mode given: taken exactly when the names are distinct
    and not empty and each has its own 'min' or 'max'; else a ConfigError, never another."""
    good = (
        bool(metrics)
        and all(metrics)
        and len(set(metrics)) == len(metrics)
        and isinstance(modes, list)
        and len(modes) == len(metrics)
        and all(mode in ("min", "max") for mode in modes)
    )
    try:
        config = TuneConfig(search_alg=OptunaSearch(metric=metrics, mode=modes))
    except ConfigError:
        assert not good
    else:
        assert good
        assert config.objectives == list(zip(metrics, modes, strict=True))
