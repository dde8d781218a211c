"""A search space flattened for Optuna: its domains and grid named by their path joined with ``/``
(``train_loop_config/lr``), and each trial's nested config rebuilt from the parameters Optuna
sampled, ``sample_from`` values called with the config so far under random generators seeded
from the trial's name and parameters (so a resumed or restored trial gets the value it had)."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.search_space import SEARCHER_PARAM, SEPARATOR, Domain, GridSearch, SampleFrom

if TYPE_CHECKING:
    import optuna.distributions as dist


@dataclass(frozen=True)
class FlatSpace:
    """A param_space flattened: sampled domains, grid axes and constants by path."""

    domains: dict[str, Domain]
    grids: dict[str, tuple[Any, ...]]
    constants: dict[str, Any]
    derived: dict[str, SampleFrom]

    def distributions(self) -> dict[str, dist.BaseDistribution]:
        """Optuna distributions of the sampled parameters and the grid axes."""
        import optuna.distributions as dist

        found = {path: domain.distribution() for path, domain in self.domains.items()}
        for path, values in self.grids.items():
            found[path] = dist.CategoricalDistribution(values)
        return found

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid axes (one empty point without a grid)."""
        paths = sorted(self.grids)
        return [
            dict(zip(paths, combo, strict=True))
            for combo in itertools.product(*(self.grids[p] for p in paths))
        ]

    def config(self, params: Mapping[str, Any], trial_name: str = "") -> dict[str, Any]:
        """The nested config of the trial ``trial_name``: the values of its sampled
        ``params`` (not the searcher's own), the constants, then the ``sample_from`` values."""
        values = {
            path: self.domains[path].value(value) if path in self.domains else value
            for path, value in params.items()
            if not path.startswith(SEARCHER_PARAM)
        }
        nested: dict[str, Any] = {}
        for path, value in {**self.constants, **values}.items():
            _put(nested, path, value)
        if self.derived:
            with _seeded(f"{trial_name}|{sorted(params.items())!r}"):
                for path, derived in self.derived.items():
                    _put(nested, path, derived.func(_Spec(_Config(nested))))
        return nested


def _put(nested: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(SEPARATOR)
    node = nested
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


class _Config(dict):  # type: ignore[type-arg]
    """A config read as Ray's ``spec.config``: ``spec.config.lr`` or ``spec.config["lr"]``."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(
                f"spec.config has no {name!r} (yet): it has {sorted(self)}; sample_from values "
                "are computed after every other parameter, in the order of the param_space."
            ) from None
        return _Config(value) if isinstance(value, dict) else value


@dataclass(frozen=True)
class _Spec:
    config: _Config


@contextmanager
def _seeded(key: str) -> Iterator[None]:
    """Python's and NumPy's global random generators seeded from ``key``, then put back."""
    import numpy as np

    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    python_state, numpy_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def flatten(param_space: Mapping[str, Any], prefix: str = "") -> FlatSpace:
    """Split a nested param_space into domains, grid axes and constants by path."""
    space = FlatSpace({}, {}, {}, {})
    for key, value in param_space.items():
        if not isinstance(key, str) or SEPARATOR in key:
            raise ConfigError(f"param_space key {key!r} must be a str without '/'.")
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            inner = flatten(value, f"{path}{SEPARATOR}")
            space.domains.update(inner.domains)
            space.grids.update(inner.grids)
            space.constants.update(inner.constants)
            space.derived.update(inner.derived)
        elif isinstance(value, Domain):
            space.domains[path] = value
        elif isinstance(value, GridSearch):
            space.grids[path] = value.values
        elif isinstance(value, SampleFrom):
            space.derived[path] = value
        else:
            space.constants[path] = value
    return space
