"""Search algorithms, named as in Ray Tune; each is one of Optuna's samplers.

``OptunaSearch`` samples with TPE by default (or any Optuna sampler you give it);
``BasicVariantGenerator``, Ray's default, samples at random. With either, every
``grid_search`` value is tried: the grid points are queued in the study (Optuna's
``enqueue_trial``) and the sampler fills in the other parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, kw_only=True)
class Searcher:
    """Base class: proposes each trial's parameters."""

    seed: int | None = None

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        """The Optuna sampler doing this searcher's job."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class OptunaSearch(Searcher):
    """Optuna's sampler (TPE unless ``sampler`` is given), as Ray's ``OptunaSearch``.

    Args:
        sampler: An Optuna sampler, e.g. ``optuna.samplers.RandomSampler(seed=0)``; ``None``
            is ``TPESampler(seed=seed)``.
        seed: Seed of the default TPE sampler.
    """

    sampler: optuna.samplers.BaseSampler | None = None

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        if self.sampler is not None:
            return self.sampler
        return optuna.samplers.TPESampler(seed=self.seed)


@dataclass(frozen=True, kw_only=True)
class BasicVariantGenerator(Searcher):
    """Random search (plus every grid point), Ray's default searcher."""

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        return optuna.samplers.RandomSampler(seed=self.seed)
