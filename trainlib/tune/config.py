"""TuneConfig: what to optimise and how, as Ray Tune's ``TuneConfig``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from trainlib import ray_hints
from trainlib.errors import ConfigError
from trainlib.tune.schedulers import FIFOScheduler, TrialScheduler
from trainlib.tune.search import (
    BasicVariantGenerator,
    ConcurrencyLimiter,
    OptunaSearch,
    Searcher,
)

if TYPE_CHECKING:
    from trainlib.tune.callback import Trial


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """How a Tuner searches.

    Args:
        metric: The reported metric to optimise; trials are compared on its last value.
            ``None`` (with ``mode=None``), as in Ray: trials are only run, never compared
            (a random search, no early stopping; a trial need not report anything), and
            ``ResultGrid.get_best_result`` needs the metric named.
        mode: ``"min"`` or ``"max"``.
        num_samples: Trials to run; with ``grid_search`` values, each grid point is tried
            ``num_samples`` times (as in Ray).
        max_concurrent_trials: Trials running at once, at most. ``None``: as many as the
            cluster's free workers allow (a trial needs its ``num_workers``).
        search_alg: Proposes each trial's parameters (TPE by default; random without a
            metric).
        scheduler: Stops unpromising trials early: none by default (``FIFOScheduler``, Ray's
            default); ``ASHAScheduler()`` stops the worst early.
        study_storage: Optuna storage URL of the study (e.g. ``postgresql://...``).
            ``None``: a sqlite file ``study.db`` in the experiment directory, which must
            then be local.
        seed: Seed of the default search algorithm, for repeatable searches.
        time_budget_s: Seconds (or a ``timedelta``) the search may run, from its first
            result: then every running trial ends (as complete, with its last result) and no
            new one starts, as ``tune.stopper.TimeoutStopper`` does.
        reuse_actors: Ray's, accepted for ported scripts; no effect here.
        trial_dirname_creator: Names each new trial's run directory (and the trial) from its
            ``Trial`` (``trial_id``, ``config``, ``trainable_name``), as Ray's; a non-empty
            name without '/', different for every trial.
        trial_name_creator: Ray's trial name: here the same (a trial's name is its directory's);
            ``trial_dirname_creator`` wins when both are given.
    """

    metric: str | None = None
    mode: Literal["min", "max"] | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    search_alg: Searcher | None = None
    scheduler: TrialScheduler = field(default_factory=FIFOScheduler)
    study_storage: str | None = None
    seed: int | None = None
    time_budget_s: float | timedelta | None = None
    reuse_actors: bool | None = None  # Ray's; no effect (``trainlib.ray_hints``)
    trial_name_creator: Callable[[Trial], str] | None = None
    trial_dirname_creator: Callable[[Trial], str] | None = None

    @property
    def trial_naming(self) -> Callable[[Trial], str] | None:
        """What names a new trial: ``trial_dirname_creator``, else ``trial_name_creator``."""
        return self.trial_dirname_creator or self.trial_name_creator

    def __post_init__(self) -> None:
        ray_hints.accept("TuneConfig", "reuse_actors", self.reuse_actors, False)
        self._take_metric_from_parts()
        budget = self.time_budget_s
        seconds = budget.total_seconds() if isinstance(budget, timedelta) else budget
        if budget is not None and not (isinstance(seconds, (int, float)) and seconds > 0):
            raise ConfigError(
                f"TuneConfig(time_budget_s={budget!r}) must be a positive number of seconds, a "
                "datetime.timedelta, or None."
            )
        if (self.metric is None) != (self.mode is None) or self.metric == "":
            raise ConfigError(
                f"TuneConfig(metric={self.metric!r}, mode={self.mode!r}) needs both (e.g. "
                "metric='loss', mode='min'), or neither to run trials without comparing them."
            )
        if self.metric is None:
            self._check_without_metric()
        elif self.mode not in ("min", "max"):
            raise ConfigError(f"TuneConfig(mode={self.mode!r}) must be 'min' or 'max'.")
        if self.num_samples < 1:
            raise ConfigError(f"TuneConfig(num_samples={self.num_samples}) must be >= 1.")
        if self.max_concurrent_trials is not None and self.max_concurrent_trials < 1:
            raise ConfigError(
                f"TuneConfig(max_concurrent_trials={self.max_concurrent_trials}) must be "
                ">= 1 or None."
            )

    def _take_metric_from_parts(self) -> None:
        """``metric``/``mode`` given to the searcher or the scheduler instead (as Ray allows)."""
        for part in (self.search_alg, self.scheduler):
            if part is None or (part.metric is None and part.mode is None):
                continue
            if isinstance(part.metric, (list, tuple)):  # multi-objective: the searcher's own
                if self.metric is not None or self.mode is not None:
                    raise ConfigError(
                        f"TuneConfig(metric={self.metric!r}) with {type(part).__name__}("
                        f"metric={part.metric!r}): a multi-objective search ranks no trials; "
                        "leave TuneConfig's metric and mode out and name one in "
                        "ResultGrid.get_best_result(metric, mode)."
                    )
                continue
            if (part.metric, part.mode) == (self.metric, self.mode):
                continue  # the same in both places, as Ray's examples write it
            if self.metric is not None or self.mode is not None:
                raise ConfigError(
                    f"TuneConfig(metric={self.metric!r}, mode={self.mode!r}) and "
                    f"{type(part).__name__}(metric={part.metric!r}, mode={part.mode!r}): give "
                    "the same ones, or in one place only (TuneConfig, or the searcher or "
                    "scheduler)."
                )
            object.__setattr__(self, "metric", part.metric)
            object.__setattr__(self, "mode", part.mode)

    @property
    def concurrency(self) -> int | None:
        """Trials running at once, at most: ``max_concurrent_trials``, or a
        ``ConcurrencyLimiter``'s if smaller (None: as free workers allow)."""
        limits = [self.max_concurrent_trials]
        if isinstance(self.search_alg, ConcurrencyLimiter):
            limits.append(self.search_alg.max_concurrent)
        given = [limit for limit in limits if limit is not None]
        return min(given) if given else None

    @property
    def objectives(self) -> list[tuple[str, Literal["min", "max"]]]:
        """What Optuna is told of each complete trial: (metric, mode) pairs, its last value of
        each; none in a search without a metric."""
        if self.search_alg is not None and (several := self.search_alg.objectives()):
            return several
        return [] if self.metric is None or self.mode is None else [(self.metric, self.mode)]

    def _check_without_metric(self) -> None:
        if not isinstance(self.scheduler, FIFOScheduler):
            raise ConfigError(
                f"TuneConfig(scheduler={type(self.scheduler).__name__}(...)) stops trials on a "
                "metric: give TuneConfig(metric=..., mode=...)"
                + (
                    " (a multi-objective search takes FIFOScheduler only)."
                    if self.objectives
                    else "."
                )
            )
        if self.objectives:
            return  # a multi-objective searcher learns from its own metrics
        if isinstance(self.search_alg, OptunaSearch):
            raise ConfigError(
                "TuneConfig(search_alg=OptunaSearch(...)) learns from a metric: give "
                "TuneConfig(metric=..., mode=...), or search at random (BasicVariantGenerator)."
            )

    @property
    def searcher(self) -> Searcher:
        """The search algorithm to use: ``search_alg``, else TPE seeded with ``seed`` (random
        search without a metric)."""
        if self.search_alg is not None:
            return self.search_alg
        if self.metric is None:
            return BasicVariantGenerator(seed=self.seed)
        return OptunaSearch(seed=self.seed)
