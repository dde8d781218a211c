"""HyperOpt's hp.* spaces in HyperOptSearch(space=...), sampled by Optuna: every generated
space's configs fall inside HyperOpt's own ranges, take the shape HyperOpt gives them (only the
chosen option of a choice), come back the same for a trial asked again (a resumed trial), and
points keyed by labels are taken as Ray takes them."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest
from hyperopt import hp
from hyperopt.pyll import scope
from hyperopt.pyll.stochastic import sample
from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib import ConfigError
from trainlib.tune import TuneConfig
from trainlib.tune.search import ConcurrencyLimiter
from trainlib.tune.search.hyperopt import HyperOptSearch
from trainlib.tune.search.hyperopt_space import label_point, suggest_config
from trainlib.tune.search_space import SEARCHER_PARAM

optuna.logging.set_verbosity(optuna.logging.ERROR)

# Each kind: (hp expression of a label, check of a value against HyperOpt's own range)
KINDS: dict[str, Any] = {
    "uniform": (lambda n: hp.uniform(n, -3, 5), lambda v: -3 <= v <= 5),
    "loguniform": (
        lambda n: hp.loguniform(n, -4, 1),
        lambda v: math.exp(-4) * (1 - 1e-9) <= v <= math.exp(1) * (1 + 1e-9),
    ),
    "quniform": (lambda n: hp.quniform(n, 0, 10, 2), lambda v: v in (0, 2, 4, 6, 8, 10)),
    "randint": (lambda n: hp.randint(n, 5), lambda v: isinstance(v, int) and 0 <= v < 5),
    "randint2": (lambda n: hp.randint(n, 3, 7), lambda v: isinstance(v, int) and 3 <= v < 7),
    "uniformint": (lambda n: hp.uniformint(n, 1, 4), lambda v: v in (1, 2, 3, 4)),
    "normal": (lambda n: hp.normal(n, 2, 0.5), lambda v: math.isfinite(v)),
    "lognormal": (lambda n: hp.lognormal(n, 0, 1), lambda v: v > 0),
    "qnormal": (lambda n: hp.qnormal(n, 0, 3, 1), lambda v: float(v).is_integer()),
    "int": (lambda n: scope.int(hp.quniform(n, 1, 9, 1)), lambda v: isinstance(v, int)),
    "arith": (lambda n: hp.uniform(n, 0, 1) * 2 + 1, lambda v: 1 <= v <= 3),
    "choice": (lambda n: hp.choice(n, ["a", "b", 3]), lambda v: v in ("a", "b", 3)),
}


def _space(kinds: list[str], conditional: bool) -> dict[str, Any]:
    space: dict[str, Any] = {f"p{i}": KINDS[kind][0](f"p{i}") for i, kind in enumerate(kinds)}
    space["steps"] = 7
    if conditional:
        space["act"] = hp.choice(
            "act", [{"name": "relu", "mult": hp.uniform("mult", 1, 2)}, {"name": "tanh"}]
        )
    return space


def _configs(space: dict[str, Any], trials: int, seed: int) -> list[tuple[dict, dict]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    found = []
    for _ in range(trials):
        trial = study.ask()
        found.append((suggest_config(space, trial), dict(trial.params)))
        study.tell(trial, 0.0)
    return found


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=5),
    conditional=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hyperopt_space_configs_as_hyperopt_shapes_them(kinds, conditional, seed) -> None:
    space = _space(kinds, conditional)
    hyperopt_shape = sample(space)  # HyperOpt's own sample: the shape configs must have
    for config, params in _configs(space, 8, seed):
        assert set(config) == set(hyperopt_shape)
        assert config["steps"] == 7
        for i, kind in enumerate(kinds):
            assert KINDS[kind][1](config[f"p{i}"]), (kind, config[f"p{i}"])
        if conditional:  # only the chosen option, with its own parameter
            assert config["act"]["name"] in ("relu", "tanh")
            assert ("mult" in config["act"]) == (config["act"]["name"] == "relu")
            assert (SEARCHER_PARAM + "mult" in params) == ("mult" in config["act"])
        assert all(name.startswith(SEARCHER_PARAM) for name in params)
        # asked again with its parameters fixed (a resumed trial): the same config
        again = optuna.create_study()
        again.enqueue_trial(params)
        assert suggest_config(space, again.ask()) == config


def test_hyperopt_space_points_keyed_by_label_as_rays() -> None:
    space = _space(["uniform", "choice", "normal"], conditional=True)
    point = {"p0": 1.5, "p1": "b", "p2": 2.5, "act": 1}  # act's options are dicts: an index
    params = label_point(space, point)
    assert params[SEARCHER_PARAM + "p0"] == 1.5
    assert params[SEARCHER_PARAM + "p1"] == 1  # the option's index
    assert params[SEARCHER_PARAM + "act"] == 1
    study = optuna.create_study()
    study.enqueue_trial(params)
    config = suggest_config(space, study.ask())
    assert config["p0"] == 1.5 and config["p1"] == "b" and config["act"] == {"name": "tanh"}
    assert config["p2"] == pytest.approx(2.5)  # a normal is searched as its quantile
    with pytest.raises(ConfigError, match="no hp label 'nope'"):
        label_point(space, {"nope": 1})
    with pytest.raises(ConfigError, match="not one of the choice's options"):
        label_point(space, {"p1": "z"})
    with pytest.raises(ConfigError, match="name one by its index, 0 to 1"):
        label_point(space, {"act": {"name": "tanh"}})


def test_hyperopt_search_takes_hp_spaces_and_refuses_what_it_cannot() -> None:
    space = _space(["uniform"], conditional=True)
    searcher = HyperOptSearch(space, metric="loss", mode="min", points_to_evaluate=[{"p0": 0}])
    assert searcher.optuna_space() == {} and searcher.define_by_run() is not None
    assert searcher.study_points() == [{SEARCHER_PARAM + "p0": 0}]
    limited = TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=2))
    assert limited.searcher.study_points() == [{SEARCHER_PARAM + "p0": 0}]
    with pytest.raises(ConfigError, match="no hp label 'width'"):
        HyperOptSearch(space, points_to_evaluate=[{"width": 1}])
    with pytest.raises(ConfigError, match="mixes hp"):
        HyperOptSearch(
            {"a": hp.uniform("a", 0, 1), "b": optuna.distributions.IntDistribution(0, 3)}
        )
    with pytest.raises(ConfigError, match="takes HyperOpt's hp"):
        HyperOptSearch({"lr": object()})
    pchoice = {"p": hp.pchoice("p", [(0.2, "x"), (0.8, "y")])}
    assert {c["p"] for c, _ in _configs(pchoice, 20, 0)} == {"x", "y"}
