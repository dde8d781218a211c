"""``from ray.tune.search.hyperopt import HyperOptSearch`` ports as
``from trainlib.tune.search.hyperopt import HyperOptSearch``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.search import Searcher
from trainlib.tune.search.hyperopt_space import is_hyperopt_space, label_point, suggest_config

if TYPE_CHECKING:
    import optuna

__all__ = ["HyperOptSearch"]


@dataclass(frozen=True)
class HyperOptSearch(Searcher):
    """HyperOpt's Tree-structured Parzen Estimator, as Ray's ``HyperOptSearch``: Optuna's
    ``TPESampler`` with HyperOpt's settings (``n_initial_points`` random trials first, 24
    candidates a proposal).

    Args:
        space: HyperOpt's own space, as Ray takes it: a dict (nested as the config) of
            ``hp.*`` expressions and constants, conditional ``hp.choice`` options included,
            each label searched by Optuna define-by-run (``hyperopt_space``; needs the
            ``hyperopt`` package, the ``[hyperopt]`` extra); or a dict of Optuna
            distributions; or None: the Tuner's ``param_space`` (``tune.uniform``, ...).
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
        if is_hyperopt_space(space):
            if any(isinstance(value, dist.BaseDistribution) for value in space.values()):
                raise ConfigError(
                    "HyperOptSearch(space=...) mixes hp.* expressions and Optuna distributions: "
                    "give one kind (hp.uniform(...) for each, or Optuna's for each)."
                )
            self.study_points()  # a point naming no label fails here
        elif not all(isinstance(value, dist.BaseDistribution) for value in space.values()):
            raise ConfigError(
                "HyperOptSearch(space=...) takes HyperOpt's hp.* expressions or Optuna "
                "distributions; give the space that way, or as the Tuner's "
                "param_space={'x': tune.uniform(...)}."
            )
        if self.n_initial_points < 1 or not 0 < self.gamma < 1:
            raise ConfigError(
                f"HyperOptSearch(n_initial_points={self.n_initial_points}, gamma={self.gamma}) "
                "needs n_initial_points >= 1 and 0 < gamma < 1."
            )

    def optuna_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {} if is_hyperopt_space(self.space) else dict(self.space or {})

    def define_by_run(self) -> Callable[[optuna.Trial], dict[str, Any] | None] | None:
        return partial(suggest_config, self.space or {}) if is_hyperopt_space(self.space) else None

    def study_points(self) -> list[dict[str, Any]]:
        """With an ``hp.*`` space, each point is keyed by labels, as Ray's (a choice given the
        value of one of its options)."""
        if not is_hyperopt_space(self.space):
            return super().study_points()
        return [label_point(self.space or {}, point) for point in self.points_to_evaluate or []]

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        seed = self.random_state_seed if self.random_state_seed is not None else self.seed
        return optuna.samplers.TPESampler(
            n_startup_trials=self.n_initial_points,
            n_ei_candidates=24,
            seed=seed,
        )
