"""PBT's hyperparameter mutations (``hyperparam_mutations``): checked when the scheduler is made,
sampled for a config that lacks them, and applied as Ray's PopulationBasedTraining explores
(resampled with ``resample_probability``, else a list's neighbour or the value times a factor)."""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

from trainlib.errors import ConfigError
from trainlib.tune.search_space import Domain, SampleFrom


def check_mutations(mutations: Mapping[str, Any], prefix: str = "") -> None:
    for key, value in mutations.items():
        if isinstance(value, Mapping):
            check_mutations(value, f"{prefix}{key}.")
        elif isinstance(value, SampleFrom):
            raise ConfigError(
                f"hyperparam_mutations[{prefix}{key!r}] is a tune.sample_from, which PBT "
                "cannot resample (as in Ray): give a list, a domain (tune.uniform, ...) or a "
                "function returning a value."
            )
        elif not isinstance(value, (list, tuple, Domain)) and not callable(value):
            raise ConfigError(
                f"hyperparam_mutations[{prefix}{key!r}]={value!r} must be a list, a domain "
                "(tune.uniform, ...), a function returning a value, or a dict of these."
            )


def fill(config: dict[str, Any], mutations: Mapping[str, Any], rng: random.Random) -> None:
    for key, space in mutations.items():
        if isinstance(space, Mapping):
            inner = config.setdefault(key, {})
            if isinstance(inner, dict):
                fill(inner, space, rng)
        elif key not in config:
            config[key] = sample(space, rng)


def sample(space: Any, rng: random.Random) -> Any:
    if isinstance(space, (list, tuple)):
        return rng.choice(list(space))
    if isinstance(space, Domain):
        return space.sample(rng)
    return space()


def explore(
    config: dict[str, Any],
    mutations: Mapping[str, Any],
    resample_probability: float,
    factors: tuple[float, float],
    rng: random.Random,
) -> dict[str, Any]:
    """``config`` perturbed as Ray's ``PopulationBasedTraining`` perturbs it."""
    new = copy.deepcopy(config)
    for key, space in mutations.items():
        if isinstance(space, Mapping):
            new[key] = explore(config.get(key, {}), space, resample_probability, factors, rng)
        elif isinstance(space, (list, tuple)):
            values = list(space)
            if rng.random() < resample_probability or config.get(key) not in values:
                new[key] = rng.choice(values)
            else:
                index = values.index(config[key]) + rng.choice((-1, 1))
                new[key] = values[min(max(index, 0), len(values) - 1)]
        elif rng.random() < resample_probability or key not in config:
            new[key] = sample(space, rng)
        else:
            new[key] = config[key] * rng.choice(factors)
            if isinstance(config[key], int) and not isinstance(config[key], bool):
                new[key] = int(new[key])
    return new
