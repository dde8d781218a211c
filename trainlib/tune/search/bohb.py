"""``from ray.tune.search.bohb import TuneBOHB`` ports as
``from trainlib.tune.search.bohb import TuneBOHB``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.search import Searcher

if TYPE_CHECKING:
    import optuna

__all__ = ["TuneBOHB"]


@dataclass(frozen=True)
class TuneBOHB(Searcher):
    """BOHB's model-based search, as Ray's ``TuneBOHB``: Optuna's multivariate TPE (a density
    model over all parameters at once, as BOHB's), meant with ``HyperBandForBOHB`` (Optuna's
    Hyperband pruner), the pairing Optuna's documentation gives for BOHB.

    Args:
        space: Not taken as a ConfigSpace: give the space as the Tuner's ``param_space``.
        bohb_config: BOHB's own settings: noted, not used (TPE has its own).
        max_concurrent: Ray's older cap on trials at once: use ``ConcurrencyLimiter`` or
            ``TuneConfig(max_concurrent_trials=)``; 0 (Ray's default) means none.
        seed: The sampler's seed.
        points_to_evaluate: Configs the first trials take (see ``Searcher``).
    """

    space: Any = None
    bohb_config: dict[str, Any] | None = field(default=None, kw_only=True)
    max_concurrent: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.space is not None:
            raise ConfigError(
                "TuneBOHB(space=...) with a ConfigSpace is not taken: give the space as "
                "Tuner(param_space={'x': tune.uniform(...)})."
            )
        if self.max_concurrent:
            raise ConfigError(
                f"TuneBOHB(max_concurrent={self.max_concurrent}): cap the trials with "
                "ConcurrencyLimiter(TuneBOHB(...), max_concurrent=...) or "
                "TuneConfig(max_concurrent_trials=...)."
            )

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        return optuna.samplers.TPESampler(multivariate=True, seed=self.seed)
