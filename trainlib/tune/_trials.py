"""Runs a Tuner's trials: each one a trainlib run in a thread of the driver, on one client.

A trial holds its workers from a ``WorkerBook`` while it runs, so trials run at once only as
far as the cluster's free workers allow (and ``max_concurrent_trials``); the others wait.
Each report goes to the search's stopper (``RunConfig(stop=...)``) and to Optuna
(``_TrialCallback``); when either says stop, the callback raises and the run's usual stop path
ends every rank (the same path as a failed rank), after which the trial's workers are released
for the next trial. When the stopper says stop all (or a trial fails with
``FailureConfig(fail_fast=...)``), the search's cancel event ends every running trial.
With ``PopulationBasedTraining``, a report may also make the trial exploit another: its run
stops, the donor's latest checkpoint is copied into its directory as its own, and a run of the
same name resumes from it with the explored config (``schedulers.pbt``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState

from trainlib._internal.common.scheduler_rpc import scheduler_address
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver import worker_selection
from trainlib._internal.driver.controller import RunCancelled, run_training
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.callbacks import Callback, Report
from trainlib.config import ScalingConfig
from trainlib.errors import CheckpointError, NotEnoughWorkersError
from trainlib.result import Result
from trainlib.tune import callback as search
from trainlib.tune._study import Study, metric_value
from trainlib.tune.callback import Trial
from trainlib.tune.schedulers.population import Exploit, Population
from trainlib.tune.stopper import Stopper
from trainlib.tune.worker_leases import WorkerBook, WorkerLease

if TYPE_CHECKING:
    import optuna
    from distributed import Client
    from fsspec import AbstractFileSystem

logger = logging.getLogger(__name__)

_WAKE_S = 0.2  # re-check free workers this often while trials wait


class _Pruned(Exception):
    """Raised by the trial's callback to stop a trial the pruner gave up on."""


class _Stopped(Exception):
    """Raised by the trial's callback once a trial made ``max_t`` reports or its stopper
    said stop."""


class _Exploiting(Exception):
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
    callbacks: Sequence[search.Callback] = ()
    use_gpu: bool = False  # only workers with a GPU of their own run trials
    stopper: Stopper | None = None  # RunConfig(stop=...), TuneConfig(time_budget_s=...)
    fail_fast: bool | str = False  # FailureConfig(fail_fast=...)
    population: Population | None = None  # PopulationBasedTraining's view of the trials
    sized_by_config: bool = False  # each trial's config["scaling_config"] says its size

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


class TrialRunner:
    """Starts trials while workers are free, until ``num_trials`` have been asked."""

    def __init__(self, client: Client, study: Study, setup: TrialSetup) -> None:
        self._client = client
        self._study = study
        self._setup = setup
        self._book = WorkerBook()
        self._threads: dict[str, threading.Thread] = {}
        self._ended = threading.Event()
        self._cancel = threading.Event()  # set when the search stops: its trials stop too
        self._stopping = threading.Event()  # set when the search was told to stop (not failed)
        self._lock = threading.Lock()
        self._stopper_lock = threading.Lock()  # a stopper sees one result at a time
        self._first_failure: BaseException | None = None  # fail_fast="raise" raises it
        self._next: tuple[optuna.Trial, str, dict[str, Any]] | None = None  # asked, waiting
        self.outcomes: list[Trial] = []

    def run(self, num_trials: int) -> list[Trial]:
        """Run ``num_trials`` more trials; on Ctrl-C stop the running ones and raise.

        Raises:
            BaseException: The first failed trial's error, with ``fail_fast="raise"``.
        """
        remaining = num_trials
        waiting_since = time.monotonic()
        try:
            while (remaining > 0 and not self._stopping.is_set()) or self._threads:
                InterruptWatch.check()
                self._ask_stop_all()
                if self._stopping.is_set():
                    remaining = 0
                started = self._start_ready(remaining)
                remaining -= started
                if started or self._threads or remaining == 0:
                    waiting_since = time.monotonic()
                elif time.monotonic() - waiting_since > self._setup.worker_timeout_s:
                    raise self._not_enough_workers()
                self._ended.wait(_WAKE_S)
                self._ended.clear()
                self._reap()
        except BaseException:  # Ctrl-C, a time limit, a failure of the search itself
            self._cancel.set()
            raise
        finally:
            for thread in list(self._threads.values()):
                thread.join()  # each sees Ctrl-C or the cancel, and stops its ranks
            self._reap()
        self._drop_unstarted()
        if self._first_failure is not None and self._setup.fail_fast == "raise":
            raise self._first_failure
        return self.outcomes

    def stop_search(self, why: str) -> None:
        """End every running trial (as stopped, not failed) and start no more."""
        if not self._stopping.is_set():
            logger.info("Search stopping: %s", why)
            self._stopping.set()
            self._cancel.set()

    def _ask_stop_all(self) -> None:
        stopper = self._setup.stopper
        if stopper is not None and not self._stopping.is_set():
            with self._stopper_lock:
                stop = stopper.stop_all()
            if stop:
                self.stop_search(f"{type(stopper).__name__}.stop_all() is True")

    def judge(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Whether the stopper stops this trial after ``result`` (and the search, if its
        ``stop_all`` says so)."""
        stopper = self._setup.stopper
        if stopper is None:
            return False
        with self._stopper_lock:
            stop = stopper(trial_id, result)
            stop_all = stopper.stop_all()
        if stop_all:
            self.stop_search(f"{type(stopper).__name__}.stop_all() is True after {trial_id}")
        return stop

    def _start_ready(self, remaining: int) -> int:
        """Start as many trials as free workers and the concurrency limit allow. The next
        trial is asked for before its workers are reserved: its config may say how many."""
        started = 0
        limit = self._setup.max_concurrent
        while remaining - started > 0 and (limit is None or len(self._threads) < limit):
            if self._next is None:
                trial, run_name = self._study.ask("trial_{:05d}")
                config = self._study.config(trial) or self._setup.config_of(trial.params, run_name)
                self._next = (trial, run_name, config)
            trial, run_name, config = self._next
            needs = self._setup.needs(config)
            owner = uuid.uuid4().hex
            live = worker_selection.eligible_workers(
                self._client, needs.resources_per_worker, needs.use_gpu
            )
            size = needs.worker_range[1]
            if not self._book.reserve(owner, size, live):
                break
            self._next = None
            lease = self._book.lease(owner, size)
            thread = threading.Thread(
                target=self._run_trial,
                args=(trial, run_name, config, lease),
                name=f"trainlib-{run_name}",
                daemon=True,
            )
            self._threads[owner] = thread
            thread.start()
            started += 1
        return started

    def _drop_unstarted(self) -> None:
        """The search stopped with a trial asked for but never started: it ends pruned."""
        if self._next is not None:
            trial, run_name, _ = self._next
            self._next = None
            self._study.finish(trial, TrialState.PRUNED, None, {})
            logger.info("Trial %s not started: the search stopped first", run_name)

    def _reap(self) -> None:
        for owner, thread in list(self._threads.items()):
            if not thread.is_alive():
                del self._threads[owner]

    def _run_trial(
        self, trial: optuna.Trial, run_name: str, config: dict[str, Any], lease: WorkerLease
    ) -> None:
        setup = self._setup
        population = setup.population
        if population is not None:
            config = population.add(run_name, config)
        callback = _TrialCallback(self._study, trial, run_name, setup, self.judge)
        try:
            plan = self._plan(config, run_name, lease, callback)
            logger.info("Trial %s starting with %s", run_name, config)
            for search_callback in setup.callbacks:
                search_callback.on_trial_start(Trial(trial.number, run_name, config, "running"))
            outcome = self._run(plan)
            while isinstance(outcome, _Exploiting):
                config = self._exploit(trial, run_name, outcome) or config
                outcome = self._run(self._plan(config, run_name, lease, callback))
            ended = self._finish(trial, run_name, config, callback, outcome)
        except BaseException as exc:  # recorded with the trial; the search goes on
            ended = self._finish(trial, run_name, config, callback, exc)
        finally:
            if population is not None:
                population.remove(run_name)
            self._book.release(lease.owner)
            self._ended.set()
        if ended is not None:
            for search_callback in setup.callbacks:
                search_callback.on_trial_end(ended)

    def _plan(
        self,
        config: dict[str, Any],
        run_name: str,
        lease: WorkerLease,
        callback: _TrialCallback,
    ) -> RunPlan:
        setup = self._setup
        plan = setup.make_plan(config)
        run_config = replace(
            plan.run_config,
            name=run_name,
            storage_path=setup.experiment_dir,
            storage_filesystem=setup.filesystem,
            callbacks=(*plan.run_config.callbacks, callback),
        )
        return replace(plan, run_config=run_config, lease=lease, cancel=self._cancel)

    def _run(self, plan: RunPlan) -> BaseException | None:
        try:
            run_training(plan, self._client)
        except _Stopped:
            return None
        except _Exploiting as exc:  # the trial goes on from the donor's checkpoint
            return exc
        except RunCancelled as exc:  # stopped with the search: as told, or as it failed
            return None if self._stopping.is_set() else exc
        except BaseException as exc:
            return exc
        return None

    def _exploit(
        self, trial: optuna.Trial, run_name: str, exploiting: _Exploiting
    ) -> dict[str, Any] | None:
        """Copy the donor's latest checkpoint in as the trial's; its new config (None: the
        copy failed, the trial goes on as it was)."""
        setup = self._setup
        assert setup.population is not None
        exploit = exploiting.exploit
        own = RunStorage(setup.filesystem, f"{setup.experiment_dir}/{run_name}")
        donor = RunStorage(setup.filesystem, f"{setup.experiment_dir}/{exploit.donor}")
        try:
            own.adopt(donor, exploiting.index)
        except CheckpointError as exc:
            logger.warning("[exploit] trial %s goes on as it was: %s", run_name, exc)
            return None
        setup.population.exploited(run_name, exploit)
        self._study.set_config(trial, exploit.config)
        return exploit.config

    def _finish(
        self,
        trial: optuna.Trial,
        run_name: str,
        config: dict[str, Any],
        callback: _TrialCallback,
        error: BaseException | None,
    ) -> Trial | None:
        if isinstance(error, KeyboardInterrupt):
            return None  # left RUNNING: the next fit() with this name resumes it
        result = replace(callback.result or _empty_result(self._setup), config=config)
        if callback.reports:  # Ray's: with its auto-filled fields, across PBT's exploits
            history = [callback.reports[index] for index in sorted(callback.reports)]
            result = replace(result, metrics=result.metrics or history[-1], metrics_history=history)
        if callback.auto:  # Ray Tune's auto-filled fields, of the trial's last result
            auto = {**callback.auto, "done": error is None or isinstance(error, _Pruned)}
            result = replace(result, metrics={**result.metrics, **auto})
        state, value = TrialState.COMPLETE, None
        if isinstance(error, _Pruned):
            state, error = TrialState.PRUNED, None
        elif error is None:
            try:
                value = _value(result.metrics, self._setup.metric)
            except ValueError as exc:
                if self._stopping.is_set() and not callback.auto:
                    state = TrialState.PRUNED  # stopped with the search before any result
                else:
                    error = exc
        if error is not None:
            state = TrialState.FAIL
            logger.warning("Trial %s failed: %r", run_name, error)
            if self._setup.fail_fast:
                with self._lock:
                    self._first_failure = self._first_failure or error
                self.stop_search(f"trial {run_name} failed (FailureConfig(fail_fast=True))")
        result = replace(result, error=error)
        self._study.finish(trial, state, value, result.metrics, error)
        ended = Trial(trial.number, run_name, config, _STATE_NAMES[state], result)
        with self._lock:
            self.outcomes.append(ended)
        return ended

    def _not_enough_workers(self) -> NotEnoughWorkersError:
        needs = self._setup.needs(self._next[2] if self._next is not None else {})
        size = needs.worker_range[1]
        live = worker_selection.eligible_workers(
            self._client, needs.resources_per_worker, needs.use_gpu
        )
        if needs.use_gpu:
            shortage = worker_selection.gpu_shortage(
                self._client, needs, len(live), self._setup.worker_timeout_s
            )
            if shortage is not None:
                return shortage
        resources = needs.resources_per_worker
        return NotEnoughWorkersError(
            requested=size,
            num_workers=str(size),
            available=len(live),
            address=scheduler_address(self._client),
            timeout_s=self._setup.worker_timeout_s,
            resources=str(dict(resources)) if resources else "",
        )


_STATE_NAMES: dict[TrialState, Any] = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
}


def state_name(state: TrialState) -> str:
    """complete, pruned or failed."""
    return _STATE_NAMES.get(state, state.name.lower())


def _empty_result(setup: TrialSetup) -> Result:
    return Result(
        metrics={}, checkpoint=None, best_checkpoints=[], path="", filesystem=setup.filesystem
    )


def _value(metrics: dict[str, Any], metric: str | None) -> float:
    """What Optuna is told of a complete trial: its metric, or 0 in a search without one."""
    return 0.0 if metric is None else metric_value(metrics, metric)


class _TrialCallback(Callback):
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
        self._judge = judge
        self._population = setup.population
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
        if self._judge(self._trial_id, self.reports[report.index]):
            raise _Stopped(f"its stopper stopped it after {step} reports")
        if self._metric is not None:
            value = metric_value(report.metrics, self._metric)
            if self._study.report(self._trial, value, step):
                raise _Pruned(f"pruned at {self._metric}={value} after {step} reports")
        if self._max_t is not None and step >= self._max_t:
            raise _Stopped(f"reached max_t={self._max_t}")
        if self._population is not None:
            exploit = self._population.on_result(
                self._trial_id, self.reports[report.index], report.checkpoint is not None
            )
            if exploit is not None:
                raise _Exploiting(exploit, report.index)

    def on_end(self, result: Result) -> None:
        self.result = result
