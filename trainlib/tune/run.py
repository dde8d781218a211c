"""``tune.run``: the older, one-call form of a search (Ray Tune's ``tune.run``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from trainlib.config import DEFAULT_STORAGE_PATH, RunConfig
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError
from trainlib.torch.trainer import TorchTrainer
from trainlib.tune.config import TuneConfig
from trainlib.tune.result_grid import ResultGrid
from trainlib.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from trainlib.tune.search import Searcher
from trainlib.tune.tuner import Tuner

if TYPE_CHECKING:
    from distributed import Client


def run(
    run_or_experiment: TorchTrainer | Callable[[dict[str, Any]], Any] | type,
    *,
    config: Mapping[str, Any] | None = None,
    stop: Mapping[str, int] | None = None,
    metric: str | None = None,
    mode: Literal["min", "max"] | None = None,
    num_samples: int = 1,
    max_concurrent_trials: int | None = None,
    search_alg: Searcher | None = None,
    scheduler: TrialScheduler | None = None,
    name: str | None = None,
    storage_path: str = DEFAULT_STORAGE_PATH,
    dask_config: DaskConfig | None = None,
    client: Client | None = None,
) -> ResultGrid:
    """``Tuner(run_or_experiment, param_space=config, ...).fit()`` in one call.

    ``stop={"training_iteration": N}`` ends each trial (as complete) after N reports: the
    scheduler's ``max_t``, when that is larger. Returns the ``ResultGrid`` (Ray returns an
    ``ExperimentAnalysis``; use ``get_best_result().config`` for its ``best_config``).

    Raises:
        ConfigError: ``stop`` names anything but ``training_iteration``.

    Example:
        >>> grid = tune.run(train_fn, config={"lr": tune.loguniform(1e-4, 1e-1)},
        ...                 num_samples=8, metric="loss", mode="min")
    """
    tune_config = TuneConfig(
        metric=metric,
        mode=mode,
        num_samples=num_samples,
        max_concurrent_trials=max_concurrent_trials,
        search_alg=search_alg,
        scheduler=_with_stop(scheduler or _default_scheduler(metric), stop or {}),
    )
    tuner = Tuner(
        run_or_experiment,
        param_space=config,
        tune_config=tune_config,
        run_config=RunConfig(name=name, storage_path=storage_path),
        dask_config=dask_config,
        client=client,
    )
    return tuner.fit()


def _default_scheduler(metric: str | None) -> TrialScheduler:
    """ASHA, as TuneConfig's default; nothing stops trials early in a search without a metric."""
    return ASHAScheduler() if metric else FIFOScheduler()


def _with_stop(scheduler: TrialScheduler, stop: Mapping[str, int]) -> TrialScheduler:
    """The scheduler with ``max_t`` lowered to ``stop["training_iteration"]``."""
    unknown = sorted(set(stop) - {"training_iteration"})
    if unknown:
        raise ConfigError(
            f"tune.run(stop=...) supports only 'training_iteration', not {unknown}; stop on "
            "a metric by returning from the trainable."
        )
    if "training_iteration" not in stop:
        return scheduler
    limit = stop["training_iteration"]
    if not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"tune.run(stop={{'training_iteration': {limit!r}}}) must be >= 1.")
    max_t = limit if scheduler.max_t is None else min(limit, scheduler.max_t)
    return replace(scheduler, max_t=max_t)
