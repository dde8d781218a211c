"""Population Based Training, as Ray Tune's ``PopulationBasedTraining`` (asynchronous).

Every ``perturbation_interval`` of ``time_attr``, a trial in the bottom ``quantile_fraction``
of the running trials (ranked by their last ``metric``) exploits one of the top
``quantile_fraction``, chosen at random: its run stops, the donor's latest checkpoint is
copied into its run directory as its own, and it resumes from that checkpoint with the donor's
config explored. Exploring resamples each ``hyperparam_mutations`` key with
``resample_probability``, else moves it (a list's value to a neighbour, a number by one of
``perturbation_factors``), then applies ``custom_explore_fn``. Each decision is logged, and
written as Ray writes it to ``pbt_global.txt`` and ``pbt_policy_{trial}.txt`` in the search's
directory: ``[trial, donor, trial's iteration, donor's iteration, donor's config, new
config]``.

An exploited trial keeps its name, its directory and its own ``training_iteration`` count
(Ray's takes the donor's); the step saved in the donor's checkpoint is what the trainable
resumes from, as in Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlib.errors import ConfigError
from trainlib.tune.schedulers.mutations import check_mutations
from trainlib.tune.schedulers.trial_scheduler import TrialScheduler

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PopulationBasedTraining(TrialScheduler):
    """Population Based Training (Ray's signature and defaults).

    Args:
        time_attr: The increasing result that paces perturbations (Ray's default:
            ``time_total_s``; ``training_iteration`` counts reports).
        perturbation_interval: A trial is considered for exploitation each time its
            ``time_attr`` grew by this much since the last time.
        burn_in_period: No trial is perturbed before its ``time_attr`` reaches this.
        hyperparam_mutations: Per config key (nested as the config is): a list of values,
            a search space domain (``tune.uniform``, ...), a function returning a value, or a
            dict of these. Keys missing from a trial's config are sampled from here first.
        quantile_fraction: Share of the running trials in the bottom and top groups (0-0.5).
        resample_probability: Chance of a fresh sample instead of a move.
        perturbation_factors: What a number is multiplied by when moved (one at random).
        custom_explore_fn: Applied to each explored config; returns the config to use.
        log_config: Write the decisions to ``pbt_global.txt`` and ``pbt_policy_*.txt``.
        require_attrs: A result without ``time_attr`` or the metric fails the trial (else it
            is not considered).
        synch: Ray's synchronous variant, not supported (see the error).
    """

    time_attr: str = "time_total_s"
    perturbation_interval: float = 60.0
    burn_in_period: float = 0.0
    hyperparam_mutations: Mapping[str, Any] | None = None
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    perturbation_factors: tuple[float, float] = (1.2, 0.8)
    custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    log_config: bool = True
    require_attrs: bool = True
    synch: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if not self.hyperparam_mutations and self.custom_explore_fn is None:
            raise ConfigError(
                f"{name}() needs hyperparam_mutations or custom_explore_fn: what to change "
                "in an exploiting trial's config."
            )
        check_mutations(self.hyperparam_mutations or {})
        if not 0 <= self.quantile_fraction <= 0.5:
            raise ConfigError(
                f"{name}(quantile_fraction={self.quantile_fraction}) must be between 0 and 0.5."
            )
        if self.perturbation_interval <= 0:
            raise ConfigError(
                f"{name}(perturbation_interval={self.perturbation_interval}) must be > 0."
            )
        if not 0 <= self.resample_probability <= 1:
            raise ConfigError(
                f"{name}(resample_probability={self.resample_probability}) must be between 0 and 1."
            )
        if self.synch:
            raise ConfigError(
                f"{name}(synch=True) is not supported: a trial on Dask cannot be paused while "
                "its ranks keep their workers, so trials cannot wait for each other at each "
                "perturbation; use synch=False (asynchronous PBT, Ray's default)."
            )

    def _check_time_attr(self) -> None:
        if not self.time_attr:
            raise ConfigError("PopulationBasedTraining(time_attr='') must name a result.")

    def optuna_pruner(self) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.NopPruner()  # PBT stops no trial: it exploits instead
