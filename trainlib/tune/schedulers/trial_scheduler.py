"""The base of every trial scheduler, and the one that stops none (Ray's
``ray.tune.schedulers.trial_scheduler``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    import optuna

TIME_ATTR = "training_iteration"


@dataclass(frozen=True, kw_only=True)
class TrialScheduler:
    """Base class: decides when a trial stops early. ``metric`` and ``mode`` may be given here
    instead of in ``TuneConfig`` (as Ray allows), not in both."""

    time_attr: str = TIME_ATTR
    max_t: int | None = None
    metric: str | None = None
    mode: Literal["min", "max"] | None = None

    def __post_init__(self) -> None:
        self._check_time_attr()
        if self.max_t is not None and self.max_t < 1:
            raise ConfigError(f"{type(self).__name__}(max_t={self.max_t}) must be >= 1.")

    def _check_time_attr(self) -> None:
        if not isinstance(self.time_attr, str) or not self.time_attr:
            raise ConfigError(
                f"{type(self).__name__}(time_attr={self.time_attr!r}) must name an increasing "
                f"result, e.g. {TIME_ATTR!r} (the report count) or 'time_total_s'."
            )

    def optuna_pruner(self) -> optuna.pruners.BasePruner:
        """The Optuna pruner doing this scheduler's job."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class FIFOScheduler(TrialScheduler):
    """Runs every trial to its end."""

    def optuna_pruner(self) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.NopPruner()
