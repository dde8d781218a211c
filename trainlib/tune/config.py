"""TuneConfig: what to optimise and how, as Ray Tune's ``TuneConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainlib.errors import ConfigError
from trainlib.tune.schedulers import ASHAScheduler, TrialScheduler
from trainlib.tune.search import OptunaSearch, Searcher


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """How a Tuner searches.

    Args:
        metric: The reported metric to optimise; trials are compared on its last value.
        mode: ``"min"`` or ``"max"``.
        num_samples: Trials to run; with ``grid_search`` values, each grid point is tried
            ``num_samples`` times (as in Ray).
        max_concurrent_trials: Trials running at once, at most. ``None``: as many as the
            cluster's free workers allow (a trial needs its ``num_workers``).
        search_alg: Proposes each trial's parameters (TPE by default).
        scheduler: Stops unpromising trials early (ASHA by default).
        study_storage: Optuna storage URL of the study (e.g. ``postgresql://...``).
            ``None``: a sqlite file ``study.db`` in the experiment directory, which must
            then be local.
        seed: Seed of the default search algorithm, for repeatable searches.
    """

    metric: str | None = None
    mode: Literal["min", "max"] | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    search_alg: Searcher | None = None
    scheduler: TrialScheduler = field(default_factory=ASHAScheduler)
    study_storage: str | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.metric or self.mode is None:
            raise ConfigError(
                f"TuneConfig(metric={self.metric!r}, mode={self.mode!r}) needs both: Optuna "
                "optimises one reported metric, e.g. metric='loss', mode='min'."
            )
        if self.mode not in ("min", "max"):
            raise ConfigError(f"TuneConfig(mode={self.mode!r}) must be 'min' or 'max'.")
        if self.num_samples < 1:
            raise ConfigError(f"TuneConfig(num_samples={self.num_samples}) must be >= 1.")
        if self.max_concurrent_trials is not None and self.max_concurrent_trials < 1:
            raise ConfigError(
                f"TuneConfig(max_concurrent_trials={self.max_concurrent_trials}) must be "
                ">= 1 or None."
            )

    @property
    def searcher(self) -> Searcher:
        """The search algorithm to use: ``search_alg``, or TPE seeded with ``seed``."""
        return self.search_alg or OptunaSearch(seed=self.seed)
