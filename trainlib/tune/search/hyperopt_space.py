"""HyperOpt's ``hp.*`` search spaces, as Ray's ``HyperOptSearch(space=...)`` takes them, sampled
by Optuna define-by-run: the space's expression graph (HyperOpt's ``pyll``) is evaluated for
each trial, each ``hp`` label suggested by the trial under ``searcher:<label>`` (a parameter of
the search, not of the config), ``hp.choice`` taking only the option it chose (a conditional
space), other ``pyll`` functions (``scope.int``, arithmetic) applied by HyperOpt's own ``rec_eval``
to their evaluated inputs. What the evaluation returns is the trial's config, nested as the space.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.search_space import SEARCHER_PARAM

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)

_EDGE = 1e-9  # a normal's quantile is drawn from (EDGE, 1 - EDGE): finite values only
_SAMPLED = {  # HyperOpt's distributions: their parameters, by name
    "uniform": ("low", "high"),
    "loguniform": ("low", "high"),
    "quniform": ("low", "high", "q"),
    "qloguniform": ("low", "high", "q"),
    "normal": ("mu", "sigma"),
    "qnormal": ("mu", "sigma", "q"),
    "lognormal": ("mu", "sigma"),
    "qlognormal": ("mu", "sigma", "q"),
    "randint": ("low", "high"),
}


def is_hyperopt_space(space: Any) -> bool:
    """Whether ``space`` holds HyperOpt expressions (anywhere in its dicts and lists)."""
    if isinstance(space, Mapping):
        return any(is_hyperopt_space(value) for value in space.values())
    if isinstance(space, (list, tuple)):
        return any(is_hyperopt_space(value) for value in space)
    return type(space).__module__.startswith("hyperopt.")


def suggest_config(space: Mapping[str, Any], trial: optuna.Trial) -> dict[str, Any]:
    """The config of ``trial``: ``space`` evaluated with the trial's suggestions.

    Raises:
        ConfigError: A HyperOpt distribution this cannot sample.
    """
    return {key: _evaluate(value, trial) for key, value in space.items()}


def label_point(space: Mapping[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """A ``points_to_evaluate`` entry keyed by ``hp`` labels (as Ray's), as the study's
    parameters: a ``hp.choice`` given the value of one of its constant options becomes that
    option's index (Ray's conversion); one whose options are expressions takes the index.

    Raises:
        ConfigError: A label the space does not have, or a value no option of its choice has.
    """
    choices, labels = _labels(space)
    params: dict[str, Any] = {}
    for label, value in point.items():
        if label not in labels:
            raise ConfigError(
                f"HyperOptSearch(points_to_evaluate=[{dict(point)!r}]): the space has no hp "
                f"label {label!r}; its labels are {sorted(labels)}."
            )
        if label in choices:
            value = _option_index(label, value, choices[label])
        elif "normal" in (distribution := labels[label]).name:  # searched as its quantile
            mu, sigma = (arg.obj for arg in distribution.pos_args[:2])
            given = math.log(value) if "log" in distribution.name else value
            value = min(max(NormalDist(mu, sigma).cdf(given), _EDGE), 1 - _EDGE)
        params[SEARCHER_PARAM + label] = value
    return params


def _option_index(label: str, value: Any, options: list[Any]) -> int:
    """The index of the option ``value`` names: a constant option's value, as Ray converts
    it, or the index itself where an option is an expression (a dict of ``hp.*``)."""
    from hyperopt.pyll.base import Literal

    if all(isinstance(option, Literal) for option in options):
        constants = [option.obj for option in options]
        if value in constants:
            return constants.index(value)
        raise ConfigError(
            f"HyperOptSearch(points_to_evaluate=...): {label}={value!r} is not one of the "
            f"choice's options {constants!r}."
        )
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(options):
        return value
    raise ConfigError(
        f"HyperOptSearch(points_to_evaluate=...): {label}={value!r}: the choice {label!r} has "
        f"options that are expressions; name one by its index, 0 to {len(options) - 1}."
    )


def _labels(space: Any) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The options of each ``hp.choice`` in ``space``, and every ``hp`` label with its
    distribution."""
    from hyperopt.pyll.base import Apply, dfs

    choices: dict[str, list[Any]] = {}
    labels: dict[str, Any] = {}
    for root in [v for v in _leaves(space) if isinstance(v, Apply)]:
        for node in dfs(root):
            if node.name == "hyperopt_param":
                labels[node.pos_args[0].obj] = node.pos_args[1]
            if node.name == "switch" and node.pos_args[0].name == "hyperopt_param":
                choices[node.pos_args[0].pos_args[0].obj] = list(node.pos_args[1:])
    return choices, labels


def _leaves(space: Any) -> list[Any]:
    if isinstance(space, Mapping):
        return [leaf for value in space.values() for leaf in _leaves(value)]
    if isinstance(space, (list, tuple)):
        return [leaf for value in space for leaf in _leaves(value)]
    return [space]


def _evaluate(node: Any, trial: optuna.Trial) -> Any:
    from hyperopt.pyll import rec_eval
    from hyperopt.pyll.base import Apply, Literal

    if isinstance(node, Mapping):
        return {key: _evaluate(value, trial) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_evaluate(value, trial) for value in node)
    if not isinstance(node, Apply):
        return node
    if isinstance(node, Literal):
        return node.obj
    if node.name == "switch":  # hp.choice / hp.pchoice: only the chosen option is evaluated
        index = _choose(node.pos_args[0], len(node.pos_args) - 1, trial)
        return _evaluate(node.pos_args[1 + index], trial)
    if node.name == "hyperopt_param":
        return _suggest(node.pos_args[0].obj, node.pos_args[1], trial)
    if node.name == "dict":
        return {key: _evaluate(value, trial) for key, value in node.named_args}
    if node.name == "pos_args":
        return [_evaluate(value, trial) for value in node.pos_args]
    inputs = [*node.pos_args, *(value for _, value in node.named_args)]
    return rec_eval(node, memo={arg: _evaluate(arg, trial) for arg in inputs})  # HyperOpt's


def _choose(index_node: Any, options: int, trial: optuna.Trial) -> int:
    """The option a ``hp.choice`` (or ``hp.pchoice``) takes: an unordered categorical."""
    label = index_node.pos_args[0].obj
    if index_node.pos_args[1].name == "categorical":
        logger.warning(
            "HyperOptSearch: hp.pchoice(%r)'s probabilities are not used: Optuna samples its "
            "options as a plain choice",
            label,
        )
    index: int = trial.suggest_categorical(SEARCHER_PARAM + label, list(range(options)))
    return index


def _suggest(label: str, distribution: Any, trial: optuna.Trial) -> Any:
    """The trial's value of the ``hp`` distribution ``distribution`` labelled ``label``."""
    name = distribution.name
    if name not in _SAMPLED:
        raise ConfigError(
            f"HyperOptSearch(space=...): hp label {label!r} uses HyperOpt's {name!r}, which "
            "is not taken; use hp.uniform, loguniform, quniform, qloguniform, normal, "
            "qnormal, lognormal, qlognormal, randint, uniformint or choice."
        )
    args = [_evaluate(arg, trial) for arg in distribution.pos_args]
    args += [_evaluate(value, trial) for _, value in distribution.named_args]
    param = SEARCHER_PARAM + label
    if name == "randint":  # randint(upper) or randint(low, upper): upper excluded
        low, high = (0, args[0]) if len(args) == 1 else args[:2]
        return trial.suggest_int(param, int(low), int(high) - 1)
    q = args[2] if name.startswith("q") else None
    if name.endswith("uniform"):
        low, high = float(args[0]), float(args[1])
        log = "log" in name
        value = trial.suggest_float(
            param, math.exp(low) if log else low, math.exp(high) if log else high, log=log
        )
    else:  # a normal's quantile is searched, as tune.randn's
        quantile = trial.suggest_float(param, _EDGE, 1 - _EDGE)
        value = NormalDist(float(args[0]), float(args[1])).inv_cdf(quantile)
        value = math.exp(value) if "log" in name else value
    return value if q is None else round(value / q) * q
