"""A search's results: every ended trial's Result, as this ``fit()`` returned it or, for a
trial that ended in an earlier one, read back from its run directory (``Result.from_path``)
with what its study recorded (its last metrics, its error, its config)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib.config import CheckpointConfig
from trainlib.result import Result
from trainlib.tune.config import TuneConfig
from trainlib.tune.result_grid import ResultGrid

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from trainlib.tune._study import Study
    from trainlib.tune.callback import Trial

ConfigOf = Callable[[dict[str, Any], str], dict[str, Any]]  # (params, run name) -> config


def result_grid(
    study: Study,
    outcomes: list[Trial],
    experiment: RunStorage,
    tune_config: TuneConfig,
    checkpoints: CheckpointConfig,
    config_of: ConfigOf,
) -> ResultGrid:
    """Every ended trial of ``study``: ``outcomes`` (this fit's), else read back."""
    from trainlib.tune._study import state_name

    fresh = {o.number: o for o in outcomes}
    results: list[Result] = []
    states: list[str] = []
    for trial in study.ended_trials():
        outcome = fresh.get(trial.number)
        if outcome is not None and outcome.result is not None:
            results.append(outcome.result)
            states.append(outcome.state)
        else:
            results.append(restored(trial, experiment, checkpoints, config_of))
            states.append(state_name(trial.state))
    return ResultGrid(
        results,
        states,
        experiment_path=experiment.run_dir,
        metric=tune_config.metric,
        mode=tune_config.mode,
    )


def restored(
    trial: FrozenTrial, experiment: RunStorage, checkpoints: CheckpointConfig, config_of: ConfigOf
) -> Result:
    """The Result of a trial that ended in an earlier ``fit()``: its run directory read back,
    its checkpoints kept as ``checkpoints`` keeps them, its metrics, error and config as its
    study recorded them."""
    from trainlib.tune._study import CONFIG, ERROR, METRICS, RUN_NAME, trial_params

    filesystem, run_name = experiment.filesystem, trial.user_attrs[RUN_NAME]
    stored = Result.from_path(f"{experiment.run_dir}/{run_name}", filesystem)
    manager = CheckpointManager.from_storage(checkpoints, RunStorage(filesystem, stored.path))
    latest = manager.latest
    error = trial.user_attrs.get(ERROR)
    return replace(
        stored,
        metrics=dict(trial.user_attrs.get(METRICS, {})),
        checkpoint=latest.checkpoint if latest else None,
        best_checkpoints=manager.kept,
        error=RuntimeError(error) if error else None,
        config=trial.user_attrs.get(CONFIG) or config_of(trial_params(trial), run_name),
    )
