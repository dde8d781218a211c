"""Search algorithms, named as in Ray Tune; each is one of Optuna's samplers.

``OptunaSearch`` samples with TPE by default (or any Optuna sampler you give it);
``BasicVariantGenerator``, Ray's default, samples at random; ``BayesOptSearch`` is Gaussian-
process search (Optuna's ``GPSampler``). With each, every ``grid_search`` value is tried: the
grid points are queued in the study (Optuna's ``enqueue_trial``) and the sampler fills in the
other parameters. ``ConcurrencyLimiter`` caps the trials one searcher has running at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Searcher:
    """Base class: proposes each trial's parameters. ``metric`` and ``mode`` may be given
    here instead of in ``TuneConfig`` (as Ray allows), not in both."""

    seed: int | None = None
    metric: str | None = None
    mode: Literal["min", "max"] | None = None

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


@dataclass(frozen=True, kw_only=True)
class BayesOptSearch(Searcher):
    """Gaussian-process Bayesian optimisation, as Ray's ``BayesOptSearch``: Optuna's
    ``GPSampler`` (log expected improvement), which also takes integer and categorical
    parameters (Ray's takes floats only).

    Args:
        random_state: Seed (Ray's default 42).
        random_search_steps: Random trials before the Gaussian process proposes (Ray's 10).
        utility_kwargs: Ray's acquisition settings (UCB's ``kappa`` ...): GPSampler has its
            own acquisition, so they are noted in the log and not used.
        space, points_to_evaluate: Not taken: give the space as the Tuner's
            ``param_space``, and known-good points as ``grid_search`` values.
    """

    random_state: int = 42
    random_search_steps: int = 10
    utility_kwargs: dict[str, Any] | None = None
    space: Any = None
    points_to_evaluate: Any = None

    def __post_init__(self) -> None:
        if self.space is not None or self.points_to_evaluate is not None:
            raise ConfigError(
                "BayesOptSearch(space=..., points_to_evaluate=...) are not taken: give the "
                "search space as Tuner(param_space=...), and points to try first as "
                "tune.grid_search values."
            )
        if self.random_search_steps < 1:
            raise ConfigError(
                f"BayesOptSearch(random_search_steps={self.random_search_steps}) must be >= 1."
            )
        if self.utility_kwargs:
            logger.info(
                "BayesOptSearch(utility_kwargs=%s): Optuna's GPSampler uses its own "
                "acquisition (log expected improvement); these are not used",
                self.utility_kwargs,
            )

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        seed = self.seed if self.seed is not None else self.random_state
        try:
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=self.random_search_steps)
        except ImportError as exc:  # its Gaussian process needs scipy (and torch)
            raise ConfigError(
                f"BayesOptSearch needs Optuna's GPSampler, which needs scipy: pip install "
                f"scipy ({exc})."
            ) from exc


@dataclass(frozen=True)
class ConcurrencyLimiter(Searcher):
    """At most ``max_concurrent`` trials of ``searcher`` run at once, as Ray's
    ``ConcurrencyLimiter(searcher, max_concurrent)``; ``TuneConfig.max_concurrent_trials``
    still applies (the smaller wins). ``batch=True`` (wait for the whole batch to end before
    starting the next) is not taken: trials start as workers and the limit allow."""

    searcher: Searcher
    max_concurrent: int
    batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.searcher, Searcher):
            raise ConfigError(
                f"ConcurrencyLimiter(searcher={self.searcher!r}) must wrap a trainlib.tune "
                "searcher (OptunaSearch, BasicVariantGenerator, BayesOptSearch)."
            )
        if self.max_concurrent < 1:
            raise ConfigError(
                f"ConcurrencyLimiter(max_concurrent={self.max_concurrent}) must be >= 1."
            )
        if self.batch:
            raise ConfigError(
                "ConcurrencyLimiter(batch=True) is not supported: trials start one by one as "
                "workers free up; use batch=False."
            )
        for name in ("metric", "mode", "seed"):  # the wrapped searcher's
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self.searcher, name))

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        return self.searcher.optuna_sampler()
