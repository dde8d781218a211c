"""Trial schedulers, named as in Ray Tune; each is one of Optuna's pruners.

================================  =========================================
Ray Tune                          Optuna
================================  =========================================
``ASHAScheduler`` (the default;   ``SuccessiveHalvingPruner``
``AsyncHyperBandScheduler``)
``HyperBandScheduler``            ``HyperbandPruner``
``HyperBandForBOHB``              ``HyperbandPruner`` (with ``TuneBOHB``)
``MedianStoppingRule``            ``MedianPruner``
``FIFOScheduler``                 ``NopPruner`` (every trial runs to its end)
``PopulationBasedTraining``       none: its own exploit and explore (``pbt``)
================================  =========================================

The step a trial reports to Optuna is its result's ``time_attr``, rounded down to a whole
number: Ray's default ``training_iteration`` (the number of ``report()`` calls so far,
1-based), ``time_total_s``, or any increasing result the trial reports (``epoch``); a trial
whose result lacks it fails, saying so. ``grace_period`` and ``max_t`` count in its units; like
Ray, ``max_t`` ends a trial (as complete) once its ``time_attr`` reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainlib.errors import ConfigError
from trainlib.tune.schedulers.pbt import PopulationBasedTraining
from trainlib.tune.schedulers.trial_scheduler import TIME_ATTR, FIFOScheduler, TrialScheduler

if TYPE_CHECKING:
    import optuna

__all__ = [
    "TIME_ATTR",
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandForBOHB",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "TrialScheduler",
]


@dataclass(frozen=True, kw_only=True)
class ASHAScheduler(TrialScheduler):
    """Asynchronous successive halving: at each rung (``grace_period``, times
    ``reduction_factor``, ...) a trial goes on only if it is in the best
    ``1 / reduction_factor`` of the trials that reached that rung.

    Args:
        max_t: Reports after which a trial ends (Ray's default: 100).
        grace_period: Reports before a trial can be stopped.
        reduction_factor: Ray's ``reduction_factor``.
    """

    max_t: int | None = 100
    grace_period: int = 1
    reduction_factor: float = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grace_period < 1 or self.reduction_factor < 2:
            raise ConfigError(
                f"ASHAScheduler(grace_period={self.grace_period}, "
                f"reduction_factor={self.reduction_factor}) needs grace_period >= 1 and "
                "reduction_factor >= 2."
            )

    def optuna_pruner(self) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=self.grace_period,
            reduction_factor=int(self.reduction_factor),
            min_early_stopping_rate=0,
        )


AsyncHyperBandScheduler = ASHAScheduler  # Ray's other name for it


@dataclass(frozen=True, kw_only=True)
class HyperBandScheduler(TrialScheduler):
    """Hyperband: successive halving in several brackets of different aggressiveness.

    Args:
        max_t: Reports after which a trial ends, and Hyperband's maximum resource (Ray's
            default: 81).
        reduction_factor: Ray's ``reduction_factor``.
    """

    max_t: int | None = 81
    reduction_factor: float = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_t is None or self.reduction_factor < 2:
            raise ConfigError(
                f"HyperBandScheduler(max_t={self.max_t}, reduction_factor="
                f"{self.reduction_factor}) needs a max_t and reduction_factor >= 2."
            )

    def optuna_pruner(self) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.HyperbandPruner(
            min_resource=1,
            max_resource=self.max_t or 1,
            reduction_factor=int(self.reduction_factor),
        )


@dataclass(frozen=True, kw_only=True)
class HyperBandForBOHB(HyperBandScheduler):
    """Ray's ``HyperBandForBOHB``: Hyperband (Optuna's pruner) to pair with ``TuneBOHB``.
    ``stop_last_trials`` is Ray's: trials of the last bracket run to ``max_t`` here too."""

    stop_last_trials: bool = True


@dataclass(frozen=True, kw_only=True)
class MedianStoppingRule(TrialScheduler):
    """Stops a trial whose result is worse than the median of the other trials' results at
    the same step.

    Args:
        grace_period: Reports before a trial can be stopped (Ray counts seconds of
            ``time_total_s``; here it counts reports).
        min_samples_required: Trials that must have finished before any is stopped.
    """

    grace_period: int = 1
    min_samples_required: int = 3

    def optuna_pruner(self) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.MedianPruner(
            n_startup_trials=self.min_samples_required, n_warmup_steps=self.grace_period
        )
