"""``from ray.tune.search.hyperopt import HyperOptSearch`` ports as
``from trainlib.tune.search.hyperopt import HyperOptSearch``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.search import Searcher

if TYPE_CHECKING:
    import optuna

__all__ = ["HyperOptSearch"]


@dataclass(frozen=True)
class HyperOptSearch(Searcher):
    """HyperOpt's Tree-structured Parzen Estimator, as Ray's ``HyperOptSearch``: Optuna's
    ``TPESampler`` with HyperOpt's settings (``n_initial_points`` random trials first, 24
    candidates a proposal).

    Args:
        space: Not taken as HyperOpt's ``hp.*`` expressions: give the space as the Tuner's
            ``param_space`` (``tune.uniform``, ...) or a dict of Optuna distributions.
        n_initial_points: Random trials before TPE proposes (Ray's 20).
        random_state_seed: The seed (``seed`` too).
        gamma: HyperOpt's share of good trials (Ray's 0.25): noted, not used (Optuna 4.9
            deprecated setting it; its TPE counts the best 10 %, at most 25, as good).
        points_to_evaluate: Configs the first trials take (see ``Searcher``).
    """

    space: dict[str, Any] | None = None
    n_initial_points: int = field(default=20, kw_only=True)
    random_state_seed: int | None = field(default=None, kw_only=True)
    gamma: float = field(default=0.25, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        import optuna.distributions as dist

        space = self.space or {}
        if not all(isinstance(value, dist.BaseDistribution) for value in space.values()):
            raise ConfigError(
                "HyperOptSearch(space=...) with HyperOpt's hp.* expressions is not taken: give "
                "the space as Tuner(param_space={'x': tune.uniform(...)}) or as a dict of "
                "Optuna distributions."
            )
        if self.n_initial_points < 1 or not 0 < self.gamma < 1:
            raise ConfigError(
                f"HyperOptSearch(n_initial_points={self.n_initial_points}, gamma={self.gamma}) "
                "needs n_initial_points >= 1 and 0 < gamma < 1."
            )

    def optuna_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return dict(self.space or {})

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        seed = self.random_state_seed if self.random_state_seed is not None else self.seed
        return optuna.samplers.TPESampler(
            n_startup_trials=self.n_initial_points,
            n_ei_candidates=24,
            seed=seed,
        )
