"""A Tuner's Optuna study: created or resumed, used from the driver's threads under one lock.

Optuna does the searching (its sampler) and the early stopping (its pruner); this module only
keeps the study in step with trainlib's runs:

- ``grid_search`` points are queued once, when the study is created (``enqueue_trial``;
  Optuna's ``GridSampler`` does not combine with ask-and-tell and other samplers).
- A trial left RUNNING by a driver that died or was interrupted is marked FAIL and its
  parameters are queued again with its run name, so the new trial resumes that run from its
  latest checkpoint; it does not count towards ``num_samples``.
- Trials that ended (complete, pruned, failed) are never run again, but for failed ones when
  a restored search asks (``Tuner.restore(resume_errored=True)``: queued again with their run
  name, resuming from its latest checkpoint; ``restart_errored=True``: queued under a new run
  name, from scratch). ``resume_unfinished=False`` ends interrupted trials as failed instead.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState

from trainlib.errors import ConfigError
from trainlib.tune.logger import flatten as flat
from trainlib.tune.study_file import sqlite_url

if TYPE_CHECKING:
    from trainlib._internal.common.storage import RunStorage
    from trainlib.tune.config import TuneConfig

RUN_NAME = "trainlib:run_name"
METRICS = "trainlib:metrics"
ERROR = "trainlib:error"
SUPERSEDED = "trainlib:superseded"
CONFIG = "trainlib:config"  # a config PBT changed: the trial's from then on
DEFINED = "trainlib:defined"  # what a define-by-run space gave the config, by path
_GRID_QUEUED = "trainlib:grid_queued"
_SUPERSEDED_ENDED = "trainlib:superseded_trials"  # ended trials run again, by number
Failed = Literal["keep", "resume", "restart"]  # what a restored search does with failed trials
_NOT_RESUMED = "Interrupted: not resumed (Tuner.restore(resume_unfinished=False))"


@dataclass(frozen=True)
class StudySettings:
    """What the study is created with."""

    name: str
    storage_url: str
    directions: list[Literal["minimize", "maximize"]]  # one per objective
    sampler: optuna.samplers.BaseSampler
    pruner: optuna.pruners.BasePruner
    space: dict[str, Any] = field(default_factory=dict)  # the searcher's own distributions
    define: Callable[[optuna.Trial], Any] | None = None  # the searcher's define-by-run space
    points: list[dict[str, Any]] = field(default_factory=list)  # tried first, flat

    @classmethod
    def of(cls, config: TuneConfig, name: str, experiment: RunStorage) -> StudySettings:
        """The settings of search ``name`` stored in ``experiment``: its study where
        ``config.study_storage`` says, else in SQLite beside it."""
        storage_url = config.study_storage or sqlite_url(experiment.filesystem, experiment.run_dir)
        return cls(
            name=name,
            storage_url=storage_url,
            directions=[
                "minimize" if mode == "min" else "maximize" for _, mode in config.objectives
            ]
            or ["maximize"],
            sampler=config.searcher.optuna_sampler(),
            pruner=config.scheduler.optuna_pruner(),
            space=config.searcher.optuna_space(),
            define=config.searcher.define_by_run(),
            points=config.searcher.study_points(),
        )


class Study:
    """The study of one Tuner; every method may be called from any of the driver's threads."""

    def __init__(
        self,
        study: optuna.Study,
        distributions: dict[str, Any],
        define: Callable[[optuna.Trial], Any] | None = None,
    ) -> None:
        self._study = study
        self._distributions = distributions
        self._define = define
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        settings: StudySettings,
        distributions: dict[str, Any],
        grid_points: list[dict[str, Any]],
        num_samples: int,
        *,
        failed: Failed = "keep",
        resume_unfinished: bool = True,
    ) -> Study:
        """Create the study, or load it and queue its interrupted trials again (and its failed
        ones, as ``failed`` says)."""
        optuna.logging.disable_default_handler()  # trainlib never prints; logging decides
        try:
            study = optuna.create_study(
                study_name=settings.name,
                storage=settings.storage_url,
                sampler=settings.sampler,
                pruner=settings.pruner,
                directions=settings.directions,
                load_if_exists=True,
            )
        except ValueError as exc:  # e.g. the same name with the other direction
            raise ConfigError(
                f"The Optuna study {settings.name!r} cannot be opened ({exc}); give the "
                "Tuner a new RunConfig(name=...) or the same TuneConfig as before."
            ) from exc
        if not study.user_attrs.get(_GRID_QUEUED):
            for point in settings.points:  # points_to_evaluate: first, once
                study.enqueue_trial(point, skip_if_exists=True)
            for _ in range(num_samples):
                for point in grid_points:
                    if point:
                        study.enqueue_trial(point)
            study.set_user_attr(_GRID_QUEUED, True)
        if failed != "keep":  # an ended trial takes no attribute: the study lists them
            again = [t for t in _ended(study, (TrialState.FAIL,))]
            superseded = study.user_attrs.get(_SUPERSEDED_ENDED, [])
            study.set_user_attr(_SUPERSEDED_ENDED, [*superseded, *(t.number for t in again)])
            for trial in again:
                same_run = (
                    {k: trial.user_attrs[k] for k in (RUN_NAME, CONFIG) if k in trial.user_attrs}
                    if failed == "resume"
                    else {}
                )
                study.enqueue_trial(trial.params, user_attrs=same_run)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not resume_unfinished:  # ended where it stopped
                study._storage.set_trial_user_attr(trial._trial_id, ERROR, _NOT_RESUMED)
                study.tell(trial.number, state=TrialState.FAIL)
                continue
            study._storage.set_trial_user_attr(trial._trial_id, SUPERSEDED, True)
            study.tell(trial.number, state=TrialState.FAIL)
            kept = {k: trial.user_attrs[k] for k in (RUN_NAME, CONFIG) if k in trial.user_attrs}
            study.enqueue_trial(trial.params, user_attrs=kept)
        return cls(study, {**distributions, **settings.space}, settings.define)

    def counted_trials(self) -> int:
        """Trials asked so far that count towards ``num_samples``."""
        states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        with self._lock:
            return len(_ended(self._study, states))

    def ended_trials(self) -> list[FrozenTrial]:
        """Trials that ended in an earlier session (or this one), oldest first."""
        with self._lock:
            return _ended(self._study, (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))

    def ask(self, default_run_name: str) -> tuple[optuna.Trial, str, bool]:
        """The next trial with its parameters, the name of the run it trains, and whether
        that name is new (else the trial resumes a run)."""
        with self._lock:
            trial = self._study.ask(self._distributions)
            if self._define is not None:  # define-by-run: it suggests, it may return values
                trial.set_user_attr(DEFINED, flat(self._define(trial) or {}))  # the config's
            named = trial.user_attrs.get(RUN_NAME)
            run_name = named or default_run_name.format(trial.number)
            trial.set_user_attr(RUN_NAME, run_name)
        return trial, run_name, named is None

    def rename(self, trial: optuna.Trial, run_name: str) -> None:
        """Give a new trial the run name ``run_name`` (``trial_dirname_creator``'s).

        Raises:
            ConfigError: Another trial of the study has that name.
        """
        with self._lock:
            for other in self._study.get_trials(deepcopy=False):
                if other.number != trial.number and other.user_attrs.get(RUN_NAME) == run_name:
                    raise ConfigError(
                        f"trial_dirname_creator named trials {other.number} and {trial.number} "
                        f"both {run_name!r}: include trial.trial_id in the name."
                    )
            trial.set_user_attr(RUN_NAME, run_name)

    def config(self, trial: optuna.Trial | FrozenTrial) -> dict[str, Any] | None:
        """The config PBT last gave the trial (its run resumes with it), if any."""
        config = trial.user_attrs.get(CONFIG)
        return dict(config) if isinstance(config, dict) else None

    def set_config(self, trial: optuna.Trial, config: dict[str, Any]) -> None:
        """Keep the config PBT gave the trial, if JSON can hold it (else a resumed run starts
        with its sampled config)."""
        try:
            json.dumps(config)
        except (TypeError, ValueError):
            return
        with self._lock:
            trial.set_user_attr(CONFIG, config)

    def report(self, trial: optuna.Trial, value: float, step: int) -> bool:
        """Record an intermediate value; True when the pruner says to stop the trial."""
        with self._lock:
            trial.report(value, step)
            return trial.should_prune()

    def finish(
        self,
        trial: optuna.Trial,
        state: TrialState,
        values: list[float] | None,
        metrics: dict[str, Any],
        error: BaseException | None = None,
    ) -> None:
        """Tell Optuna how the trial ended (a complete one's value of each objective),
        keeping its last metrics (and error) with it."""
        with self._lock:
            trial.set_user_attr(METRICS, _jsonable(metrics))
            if error is not None:
                trial.set_user_attr(ERROR, f"{type(error).__name__}: {error}")
            values = values if state == TrialState.COMPLETE else None
            self._study.tell(trial, values, state=state)


def trial_params(trial: optuna.Trial | FrozenTrial) -> dict[str, Any]:
    """The trial's parameters by config path: Optuna's, and what a define-by-run space gave."""
    return {**trial.params, **trial.user_attrs.get(DEFINED, {})}


def _ended(study: optuna.Study, states: tuple[TrialState, ...]) -> list[FrozenTrial]:
    """The study's trials in ``states`` that no later trial took over (oldest first)."""
    superseded = set(study.user_attrs.get(_SUPERSEDED_ENDED, []))
    return [
        t
        for t in study.get_trials(deepcopy=False, states=states)
        if not t.user_attrs.get(SUPERSEDED) and t.number not in superseded
    ]


def metric_value(metrics: dict[str, Any], metric: str) -> float:
    """The metric as a finite float, or ``ValueError`` naming what the trial reported."""
    if metric not in metrics:
        raise ValueError(
            f"The trial reported {sorted(metrics)} without the metric {metric!r} that "
            f"TuneConfig(metric={metric!r}) optimises; report it with trainlib.report()."
        )
    value = float(metrics[metric])
    if not math.isfinite(value):
        raise ValueError(f"The trial reported {metric}={value}, which is not a finite number.")
    return value


def _jsonable(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics that JSON can store (Optuna's user attributes are JSON)."""
    kept = {}
    for key, value in metrics.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        kept[key] = value
    return kept


Ended = Literal["complete", "pruned", "failed"]
_STATE_NAMES: dict[TrialState, Ended] = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
}


def state_name(state: TrialState) -> Ended:
    """complete, pruned or failed (an ended trial's state, as Ray names it)."""
    return _STATE_NAMES[state]


def told_values(metrics: dict[str, Any], objectives: list[str]) -> list[float]:
    """What Optuna is told of a complete trial: each objective's ``metric_value`` (which
    raises), or 0 in a search without one."""
    return [metric_value(metrics, metric) for metric in objectives] or [0.0]
