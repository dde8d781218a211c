"""What each report of a trial does (``TrialCallback``, with what every trial of a search shares,
``TrialSetup``): Ray's auto-filled fields added, then the report handed to the search's
stopper, to Optuna (its pruner) and to PBT; when one says so, the callback raises (``Stopped``,
``Pruned``, ``Exploiting``) and the run's usual stop path ends every rank."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainlib._internal.driver.run_plan import RunPlan
from trainlib.callbacks import Callback, Report
from trainlib.config import ScalingConfig
from trainlib.errors import ConfigError
from trainlib.result import Result
from trainlib.tune._study import Study, metric_value, trial_params
from trainlib.tune.callback import Trial
from trainlib.tune.schedulers.population import Exploit, Population
from trainlib.tune.schedulers.trial_scheduler import TIME_ATTR
from trainlib.tune.stopper import Stopper

if TYPE_CHECKING:
    import optuna
    from fsspec import AbstractFileSystem

    from trainlib.tune.search_events import SearchEvents


class Pruned(Exception):
    """Raised by the trial's callback to stop a trial the pruner gave up on."""


class Stopped(Exception):
    """Raised by the trial's callback once a trial made ``max_t`` reports or its stopper
    said stop."""


class Exploiting(Exception):
    """Raised by the trial's callback when PBT says the trial exploits another."""

    def __init__(self, exploit: Exploit, index: int) -> None:
        super().__init__(f"exploits trial {exploit.donor}")
        self.exploit = exploit
        self.index = index  # the report after which it does


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a search shares."""

    make_plan: Callable[[dict[str, Any]], RunPlan]
    config_of: Callable[[dict[str, Any], str], dict[str, Any]]  # (params, trial name) -> config
    num_workers: int
    resources: Mapping[str, float] | None
    experiment_dir: str
    filesystem: AbstractFileSystem
    metric: str | None  # None: trials are run, not compared (nothing told to Optuna but 0)
    max_t: int | None
    max_concurrent: int | None
    worker_timeout_s: float
    events: SearchEvents | None = None  # the search's callbacks hear its trials
    use_gpu: bool = False  # only workers with a GPU of their own run trials
    stopper: Stopper | None = None  # RunConfig(stop=...), TuneConfig(time_budget_s=...)
    fail_fast: bool | str = False  # FailureConfig(fail_fast=...)
    population: Population | None = None  # PopulationBasedTraining's view of the trials
    sized_by_config: bool = False  # each trial's config["scaling_config"] says its size
    time_attr: str = TIME_ATTR  # the scheduler's: the result that counts a trial's progress
    naming: Callable[[Trial], str] | None = None  # TuneConfig's trial_dirname_creator
    run_names: str = "trial_{:05d}"  # a trial's default run name, of its number
    trainable_name: str = ""  # Ray's Trial.trainable_name: the trainable's name
    objectives: tuple[str, ...] | None = None  # a multi-objective search's; None: ``metric``

    @property
    def told(self) -> list[str]:
        """The metrics whose last values Optuna is told of a complete trial."""
        if self.objectives is not None:
            return list(self.objectives)
        return [] if self.metric is None else [self.metric]

    def next_trial(self, study: Study) -> tuple[optuna.Trial, str, dict[str, Any]]:
        """The study's next trial, its run name and its config. A new trial is named by
        ``naming`` if given (from its config, sampled under its default name; the config is
        kept, so a resumed trial gets it again)."""
        trial, run_name, new = study.ask(self.run_names)
        config = study.config(trial) or self.config_of(trial_params(trial), run_name)
        if new and self.naming is not None:
            seen = Trial(
                trial.number, run_name, config, "running", trainable_name=self.trainable_name
            )
            run_name = checked_name(self.naming(seen))
            study.rename(trial, run_name)
            study.set_config(trial, config)
        return trial, run_name, config

    def no_result(self) -> Result:
        """The Result of a trial whose run ended before it made one."""
        return Result(
            metrics={}, checkpoint=None, best_checkpoints=[], path="", filesystem=self.filesystem
        )

    def needs(self, config: Mapping[str, Any]) -> ScalingConfig:
        """The workers a trial of ``config`` holds: its own ScalingConfig, or the search's."""
        scaling = config.get("scaling_config") if self.sized_by_config else None
        if isinstance(scaling, ScalingConfig):
            return scaling
        return ScalingConfig(
            num_workers=self.num_workers,
            use_gpu=self.use_gpu,
            resources_per_worker=self.resources,
        )


def checked_name(name: object) -> str:
    """A run name a trial name creator returned, if it can name a directory.

    Raises:
        ConfigError: Not a non-empty str without '/', or '.' or '..'.
    """
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ConfigError(
            f"trial_dirname_creator (or trial_name_creator) returned {name!r}: it must return "
            "a non-empty str without '/', not '.' or '..' (it names the trial's directory)."
        )
    return name


class TrialCallback(Callback):
    """Hands each report, with Ray's auto-filled fields, to the stopper, to Optuna and to PBT;
    stops the run when either says so, after ``max_t`` reports, or to exploit another trial."""

    def __init__(
        self,
        study: Study,
        trial: optuna.Trial,
        trial_id: str,
        setup: TrialSetup,
        judge: Callable[[str, dict[str, Any]], bool],
    ) -> None:
        self._study = study
        self._trial = trial
        self._trial_id = trial_id
        self._metric = setup.metric
        self._max_t = setup.max_t
        self._time_attr = setup.time_attr
        self._judge = judge
        self._population = setup.population
        self._events = setup.events
        self._started = self._last = time.monotonic()
        self.result: Result | None = None
        self.auto: dict[str, Any] = {}  # Ray's auto-filled fields of the last result
        self.reports: dict[int, dict[str, Any]] = {}  # by report index, with auto fields

    def on_report(self, report: Report) -> None:
        now = time.monotonic()
        step = report.index + 1  # Ray's training_iteration: the number of reports, 1-based
        self.auto = {
            "training_iteration": step,
            "time_this_iter_s": now - self._last,
            "time_total_s": now - self._started,  # from the trial's start
            "timestamp": int(time.time()),
            "date": datetime.now().strftime("%Y-%m-%d_%H-%M-%S"),
            "trial_id": self._trial_id,
            "done": False,
        }
        self._last = now
        for rolled_back in [i for i in self.reports if i >= report.index]:  # a restarted run
            del self.reports[rolled_back]
        self.reports[report.index] = {**report.metrics, **self.auto}
        if self._events is not None:
            self._events.result(self._trial_id, self.reports[report.index], report.checkpoint)
        if self._judge(self._trial_id, self.reports[report.index]):
            raise Stopped(f"its stopper stopped it after {step} reports")
        progress = self._progress(self.reports[report.index])
        if self._metric is not None:
            value = metric_value(report.metrics, self._metric)
            if self._study.report(self._trial, value, progress):
                raise Pruned(f"pruned at {self._metric}={value} after {step} reports")
        if self._max_t is not None and progress >= self._max_t:
            raise Stopped(f"reached max_t={self._max_t} ({self._time_attr})")
        if self._population is not None:
            exploit = self._population.on_result(
                self._trial_id, self.reports[report.index], report.checkpoint is not None
            )
            if exploit is not None:
                raise Exploiting(exploit, report.index)

    def on_end(self, result: Result) -> None:
        self.result = result

    def _progress(self, result: dict[str, Any]) -> int:
        """The trial's ``time_attr``, a whole number: the step Optuna's pruner is told."""
        value = result.get(self._time_attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(
                f"The scheduler's time_attr={self._time_attr!r} is not a number in this "
                f"result ({sorted(result)}); report it at every step, or give the scheduler "
                f"time_attr={TIME_ATTR!r}."
            )
        return int(value)
