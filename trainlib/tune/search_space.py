"""Search space helpers, named as in Ray Tune: each value becomes an Optuna distribution.

A ``param_space`` is a (nested) dict whose leaves are these domains or plain values; plain
values are passed to every trial unchanged. Parameters are named by their path joined with
``/`` (``train_loop_config/lr``), in Optuna's study and in ``ResultGrid.get_dataframe()``.

Where Optuna has no distribution of its own, Optuna samples a parameter it has and the domain
maps it to the trial's value (``Domain.value``), so its samplers still learn: a normal
(``randn``) is sampled as its quantile in (0, 1); a value rounded to ``q`` where Optuna cannot
step (on a log scale, or to multiples of ``q`` as Ray rounds) is sampled unrounded, then
rounded. Optuna's study holds the sampled parameter; the trial's config holds the value.

``sample_from(func)`` is no distribution: ``func(spec)`` is called when the trial's config is
made, with ``spec.config`` the config so far (attribute access, as Ray's), and Python's and
NumPy's global random generators seeded from the trial's name and parameters, so a resumed or
restored trial gets the value it had.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.config import Searched
from trainlib.errors import ConfigError

if TYPE_CHECKING:
    import optuna.distributions as dist

SEPARATOR = "/"
SEARCHER_PARAM = "searcher:"  # a parameter of the searcher's own, never part of a config


@dataclass(frozen=True)
class Domain(Searched):
    """A parameter's range; ``distribution()`` is what Optuna samples from."""

    def distribution(self) -> dist.BaseDistribution:
        """The Optuna distribution of this domain."""
        raise NotImplementedError

    def value(self, sampled: Any) -> Any:
        """The trial's value of what Optuna sampled from ``distribution()``."""
        return sampled

    def sample(self, rng: random.Random) -> Any:
        """One value drawn at random, as Ray's ``Domain.sample`` (PBT's resampling)."""
        import optuna  # imported on use: rank processes never need it

        sampler = optuna.samplers.RandomSampler(seed=rng.randrange(2**32))
        unused: Any = None  # a random sampler draws without a study or a trial
        return self.value(sampler.sample_independent(unused, unused, "value", self.distribution()))


@dataclass(frozen=True)
class Float(Domain):
    """A float in ``[low, high]``, on a log scale if ``log``; a multiple of ``q`` if given
    (counted from ``low`` on a linear scale, as Optuna steps; rounded on a log scale)."""

    low: float
    high: float
    log: bool = False
    q: float | None = None

    def distribution(self) -> dist.BaseDistribution:
        import optuna.distributions as dist  # imported on use: rank processes never need it

        step = None if self.log else self.q  # Optuna steps linear scales only
        return dist.FloatDistribution(self.low, self.high, log=self.log, step=step)

    def value(self, sampled: Any) -> Any:
        if self.log and self.q is not None:
            return _round_to(float(sampled), self.q)
        return sampled


@dataclass(frozen=True)
class Integer(Domain):
    """An integer in ``[low, high)`` (the upper bound is excluded, as Ray's ``randint``), on a
    log scale if ``log``; rounded to a multiple of ``q`` if given."""

    low: int
    high: int
    log: bool = False
    q: int | None = None

    def distribution(self) -> dist.BaseDistribution:
        import optuna.distributions as dist  # imported on use: rank processes never need it

        return dist.IntDistribution(self.low, self.high - 1, log=self.log)

    def value(self, sampled: Any) -> Any:
        return sampled if self.q is None else int(_round_to(int(sampled), self.q))


@dataclass(frozen=True)
class Normal(Domain):
    """A float drawn from a normal distribution, rounded to a multiple of ``q`` if given.
    Optuna samples its quantile in (1e-6, 1 - 1e-6): values beyond 4.75 ``sd`` never come."""

    mean: float
    sd: float
    q: float | None = None

    def distribution(self) -> dist.BaseDistribution:
        import optuna.distributions as dist  # imported on use: rank processes never need it

        return dist.FloatDistribution(_QUANTILE_EDGE, 1 - _QUANTILE_EDGE)

    def value(self, sampled: Any) -> Any:
        drawn = statistics.NormalDist(self.mean, self.sd).inv_cdf(float(sampled))
        return drawn if self.q is None else _round_to(drawn, self.q)


_QUANTILE_EDGE = 1e-6


def _round_to(value: float, q: float) -> float:
    """``value`` rounded to a multiple of ``q``, as Ray quantizes."""
    return round(value / q) * q


@dataclass(frozen=True)
class Categorical(Domain):
    """One of ``values``."""

    values: tuple[Any, ...]

    def distribution(self) -> dist.BaseDistribution:
        import optuna.distributions as dist  # imported on use: rank processes never need it

        return dist.CategoricalDistribution(self.values)


@dataclass(frozen=True)
class SampleFrom(Searched):
    """A value computed from the rest of the config, as Ray's ``tune.sample_from``."""

    func: Callable[[Any], Any]


@dataclass(frozen=True)
class GridSearch(Searched):
    """Every one of ``values`` is tried (times ``num_samples``), as Ray's ``grid_search``."""

    values: tuple[Any, ...]


def uniform(lower: float, upper: float) -> Float:
    """A float sampled uniformly in ``[lower, upper]``."""
    _check_bounds("uniform", lower, upper)
    return Float(float(lower), float(upper))


def loguniform(lower: float, upper: float) -> Float:
    """A float sampled uniformly on a log scale in ``[lower, upper]`` (both > 0)."""
    _check_bounds("loguniform", lower, upper)
    if lower <= 0:
        raise ConfigError(f"loguniform({lower}, {upper}) needs lower > 0; use uniform for 0.")
    return Float(float(lower), float(upper), log=True)


def quniform(lower: float, upper: float, q: float) -> Float:
    """A float in ``[lower, upper]`` rounded to a multiple of ``q``."""
    _check_bounds("quniform", lower, upper)
    if q <= 0:
        raise ConfigError(f"quniform({lower}, {upper}, q={q}) needs q > 0.")
    return Float(float(lower), float(upper), q=float(q))


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Float:
    """A float sampled uniformly on a log scale in ``[lower, upper]``, rounded to a multiple
    of ``q``. (``base`` changes nothing: log-uniform is the same in every base.)"""
    _check_bounds("qloguniform", lower, upper)
    if lower <= 0 or q <= 0:
        raise ConfigError(f"qloguniform({lower}, {upper}, q={q}) needs lower > 0 and q > 0.")
    return Float(float(lower), float(upper), log=True, q=float(q))


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A float from the normal distribution of ``mean`` and standard deviation ``sd``."""
    if not sd > 0:
        raise ConfigError(f"randn(mean={mean}, sd={sd}) needs sd > 0.")
    return Normal(float(mean), float(sd))


def qrandn(mean: float, sd: float, q: float) -> Normal:
    """``randn(mean, sd)`` rounded to a multiple of ``q``."""
    if not sd > 0 or not q > 0:
        raise ConfigError(f"qrandn(mean={mean}, sd={sd}, q={q}) needs sd > 0 and q > 0.")
    return Normal(float(mean), float(sd), q=float(q))


def sample_from(func: Callable[[Any], Any]) -> SampleFrom:
    """A value ``func(spec)`` of each trial; ``spec.config`` is its config (``spec.config.lr``
    or ``spec.config["lr"]``)."""
    if not callable(func):
        raise ConfigError(f"sample_from({func!r}) needs a function of spec.")
    return SampleFrom(func)


def randint(lower: int, upper: int) -> Integer:
    """An integer in ``[lower, upper)``: the upper bound is excluded, as in Ray."""
    if not upper > lower:
        raise ConfigError(f"randint({lower}, {upper}) needs upper > lower (upper is excluded).")
    return Integer(int(lower), int(upper))


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """An integer in ``[lower, upper]`` rounded to a multiple of ``q``: the upper bound is
    included, as in Ray."""
    if not upper > lower or q < 1:
        raise ConfigError(f"qrandint({lower}, {upper}, q={q}) needs upper > lower and q >= 1.")
    return Integer(int(lower), int(upper) + 1, q=int(q))


def lograndint(lower: int, upper: int, base: float = 10) -> Integer:
    """An integer in ``[lower, upper)`` on a log scale (``base`` changes nothing)."""
    if not upper > lower or lower < 1:
        raise ConfigError(
            f"lograndint({lower}, {upper}) needs 1 <= lower < upper (upper is excluded)."
        )
    return Integer(int(lower), int(upper), log=True)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> Integer:
    """An integer in ``[lower, upper]`` on a log scale, rounded to a multiple of ``q``: the
    upper bound is included, as in Ray."""
    if not upper > lower or lower < 1 or q < 1:
        raise ConfigError(
            f"qlograndint({lower}, {upper}, q={q}) needs 1 <= lower < upper and q >= 1."
        )
    return Integer(int(lower), int(upper) + 1, log=True, q=int(q))


def choice(categories: Sequence[Any]) -> Categorical:
    """One of ``categories`` (None, bool, int, float or str values)."""
    if not categories:
        raise ConfigError("choice([]) needs at least one category.")
    return Categorical(tuple(categories))


def grid_search(values: Sequence[Any]) -> GridSearch:
    """Try every one of ``values``."""
    if not values:
        raise ConfigError("grid_search([]) needs at least one value.")
    return GridSearch(tuple(values))


def _check_bounds(name: str, lower: float, upper: float) -> None:
    if not upper > lower:
        raise ConfigError(f"{name}({lower}, {upper}) needs upper > lower.")
