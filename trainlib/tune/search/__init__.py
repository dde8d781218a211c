"""Search algorithms, named as in Ray Tune; each is one of Optuna's samplers.

``OptunaSearch`` samples with TPE by default (or any Optuna sampler you give it);
``BasicVariantGenerator``, Ray's default, samples at random; ``BayesOptSearch`` is Gaussian-
process search (Optuna's ``GPSampler``). With each, every ``grid_search`` value is tried: the
grid points are queued in the study (Optuna's ``enqueue_trial``) and the sampler fills in the
other parameters. ``ConcurrencyLimiter`` caps the trials one searcher has running at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)


Mode = Literal["min", "max"]


@dataclass(frozen=True, kw_only=True)
class Searcher:
    """Base class: proposes each trial's parameters. ``metric`` and ``mode`` may be given
    here instead of in ``TuneConfig`` (as Ray allows), not in both; a list of each is a
    multi-objective search (``OptunaSearch`` only). ``points_to_evaluate``: configs (whole or
    in part, nested as the config) the first trials take, in order; what a point leaves out
    is searched."""

    seed: int | None = None
    metric: str | list[str] | None = None
    mode: Mode | list[Mode] | None = None
    points_to_evaluate: list[dict[str, Any]] | None = None
    multi_objective: ClassVar[bool] = False  # whether a list of metrics is taken

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        """The Optuna sampler doing this searcher's job."""
        raise NotImplementedError

    def optuna_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """Parameters this searcher defines itself (besides the Tuner's ``param_space``)."""
        return {}

    def define_by_run(self) -> Callable[[optuna.Trial], dict[str, Any] | None] | None:
        """A function that suggests each trial's parameters itself (Optuna's define-by-run)."""
        return None

    def study_points(self) -> list[dict[str, Any]]:
        """``points_to_evaluate`` as the study's parameters, queued first: flat config paths."""
        from trainlib.tune.logger import flatten

        return [flatten(point) for point in self.points_to_evaluate or []]

    def objectives(self) -> list[tuple[str, Mode]] | None:
        """A multi-objective search's (metric, mode) pairs, in order; None for one metric."""
        if not isinstance(self.metric, (list, tuple)) or not isinstance(self.mode, (list, tuple)):
            return None
        return list(zip(self.metric, self.mode, strict=True))

    def __post_init__(self) -> None:
        if not isinstance(self.metric, (list, tuple)):
            if isinstance(self.mode, (list, tuple)):
                raise ConfigError(
                    f"{type(self).__name__}(metric={self.metric!r}, mode={self.mode!r}): a "
                    "list of modes goes with a list of metrics, one mode each."
                )
            return
        if not self.multi_objective:
            raise ConfigError(
                f"{type(self).__name__}(metric={self.metric!r}): this searcher optimises one "
                "metric; search several with OptunaSearch(metric=[...], mode=[...]), or "
                "combine them into one reported value (e.g. a weighted sum)."
            )
        check_objectives(type(self).__name__, self.metric, self.mode)


def check_objectives(owner: str, metrics: list[str] | tuple[str, ...], modes: Any) -> None:
    """A multi-objective search's metrics and modes, as Ray's ``OptunaSearch`` takes them.

    Raises:
        ConfigError: Not distinct names, or not one mode ('min' or 'max') for each.
    """
    names_ok = bool(metrics) and all(isinstance(m, str) and m for m in metrics)
    if not names_ok or len(set(metrics)) != len(metrics):
        raise ConfigError(
            f"{owner}(metric={list(metrics)!r}): a multi-objective search needs distinct, "
            "non-empty metric names."
        )
    if not (
        isinstance(modes, (list, tuple))
        and len(modes) == len(metrics)
        and all(mode in ("min", "max") for mode in modes)
    ):
        raise ConfigError(
            f"{owner}(metric={list(metrics)!r}, mode={modes!r}): give one mode, 'min' or "
            "'max', for each metric, as a list in the same order."
        )


@dataclass(frozen=True)
class OptunaSearch(Searcher):
    """Optuna's sampler (TPE unless ``sampler`` is given), as Ray's ``OptunaSearch``.

    Args:
        space: The parameters to search, as Ray's: a dict of Optuna distributions
            (``{"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)}``), or a
            define-by-run function that calls ``trial.suggest_*`` and may return a dict of
            constants; either joins the Tuner's ``param_space``. Keys and suggested names are
            config paths (``"model/width"`` nests).
        sampler: An Optuna sampler, e.g. ``optuna.samplers.RandomSampler(seed=0)``; ``None``
            is ``TPESampler(seed=seed)``.
        seed: Seed of the default TPE sampler.
        metric: One metric, or a list of them for a multi-objective search (Ray's), with
            ``mode`` a list of as many 'min'/'max': Optuna's study then has one direction per
            metric and is told each trial's last value of each; trials are not ranked (no
            ``TuneConfig`` metric, no early stopping: ``FIFOScheduler``), so name one in
            ``ResultGrid.get_best_result(metric, mode)``.
        points_to_evaluate: Configs the first trials take (see ``Searcher``).
        evaluated_rewards: Ray's results of ``points_to_evaluate`` already run: not taken
            (give the points to run them).
    """

    space: dict[str, Any] | Callable[[optuna.Trial], dict[str, Any] | None] | None = None
    sampler: optuna.samplers.BaseSampler | None = field(default=None, kw_only=True)
    evaluated_rewards: list[Any] | None = field(default=None, kw_only=True)
    multi_objective: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.evaluated_rewards is not None:
            raise ConfigError(
                "OptunaSearch(evaluated_rewards=...) is not taken: trials here are runs with "
                "their own directories; give the points as points_to_evaluate to run them."
            )
        if isinstance(self.space, dict):
            import optuna.distributions as dist

            wrong = {
                k: v for k, v in self.space.items() if not isinstance(v, dist.BaseDistribution)
            }
            if wrong:
                raise ConfigError(
                    f"OptunaSearch(space=...) holds {wrong!r}: give Optuna distributions "
                    "(optuna.distributions.FloatDistribution(...)), or tune.uniform(...) and "
                    "friends in the Tuner's param_space."
                )
        elif self.space is not None and not callable(self.space):
            raise ConfigError(
                f"OptunaSearch(space={self.space!r}) must be a dict of Optuna distributions or "
                "a define-by-run function of an optuna.Trial."
            )

    def optuna_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return dict(self.space) if isinstance(self.space, dict) else {}

    def define_by_run(self) -> Callable[[optuna.Trial], dict[str, Any] | None] | None:
        return None if isinstance(self.space, dict) else self.space

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


@dataclass(frozen=True)
class BayesOptSearch(Searcher):
    """Gaussian-process Bayesian optimisation, as Ray's ``BayesOptSearch``: Optuna's
    ``GPSampler`` (log expected improvement), which also takes integer and categorical
    parameters (Ray's takes floats only).

    Args:
        random_state: Seed (Ray's default 42).
        random_search_steps: Random trials before the Gaussian process proposes (Ray's 10).
        utility_kwargs: Ray's acquisition settings (UCB's ``kappa`` ...): GPSampler has its
            own acquisition, so they are noted in the log and not used.
        space: Ray's bounds of each parameter, ``{"x": (low, high)}`` (floats); it joins the
            Tuner's ``param_space``.
        points_to_evaluate: Configs the first trials take (see ``Searcher``).
    """

    space: dict[str, tuple[float, float]] | None = None
    random_state: int = field(default=42, kw_only=True)
    random_search_steps: int = field(default=10, kw_only=True)
    utility_kwargs: dict[str, Any] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, bounds in (self.space or {}).items():
            if not (
                isinstance(bounds, (tuple, list)) and len(bounds) == 2 and bounds[0] < bounds[1]
            ):
                raise ConfigError(
                    f"BayesOptSearch(space={{{name!r}: {bounds!r}}}): each parameter's bounds "
                    "are (low, high), low < high, as Ray's."
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

    def optuna_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        import optuna.distributions as dist

        return {
            name: dist.FloatDistribution(float(low), float(high))
            for name, (low, high) in (self.space or {}).items()
        }

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
        super().__post_init__()
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
        for name in ("metric", "mode", "seed", "points_to_evaluate"):  # the wrapped searcher's
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self.searcher, name))

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        return self.searcher.optuna_sampler()

    def optuna_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return self.searcher.optuna_space()

    def define_by_run(self) -> Callable[[optuna.Trial], dict[str, Any] | None] | None:
        return self.searcher.define_by_run()

    def study_points(self) -> list[dict[str, Any]]:
        if self.points_to_evaluate is self.searcher.points_to_evaluate:
            return self.searcher.study_points()  # the wrapped searcher's points, its way
        return super().study_points()
