"""Runs a Tuner's trials: each one a trainlib run in a thread of the driver, on one client.

A trial holds its workers from a ``WorkerBook`` while it runs, so trials run at once only as
far as the cluster's free workers allow (and ``max_concurrent_trials``); the others wait.
Each report goes through the trial's callback (``trial_callback``: the stopper, Optuna, PBT);
when it says stop, the run's usual stop path ends every rank, after which the trial's workers
are released for the next trial. When the stopper says stop all (or a trial fails with
``FailureConfig(fail_fast=...)``), the search's cancel event ends every running trial. A trial
PBT makes exploit another stops, takes the donor's latest checkpoint as its own
(``checkpoint_copy``), and resumes under its name with the explored config.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState

from trainlib._internal.common import checkpoint_copy
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver import worker_selection
from trainlib._internal.driver.controller import RunCancelled, run_training
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.errors import CheckpointError, NotEnoughWorkersError
from trainlib.tune._study import Study, state_name, told_values
from trainlib.tune.callback import Trial
from trainlib.tune.search_events import SearchEvents
from trainlib.tune.trial_callback import Exploiting, Pruned, Stopped, TrialCallback, TrialSetup
from trainlib.tune.worker_leases import WorkerBook, WorkerLease

if TYPE_CHECKING:
    import optuna
    from distributed import Client

logger = logging.getLogger(__name__)

_WAKE_S = 0.2  # re-check free workers this often while trials wait


class TrialRunner:
    """Starts trials while workers are free, until ``num_trials`` have been asked."""

    def __init__(self, client: Client, study: Study, setup: TrialSetup) -> None:
        self._client = client
        self._study = study
        self._setup = setup
        self._events = setup.events or SearchEvents([], setup.filesystem, setup.experiment_dir)
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
                self._next = self._setup.next_trial(self._study)
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
        callback = TrialCallback(self._study, trial, run_name, setup, self.judge)
        seen = self._events.trial(trial.number, run_name, config)
        try:
            plan = self._plan(config, run_name, lease, callback)
            logger.info("Trial %s starting with %s", run_name, config)
            self._events.started(seen)
            outcome = self._run(plan)
            while isinstance(outcome, Exploiting):
                config = self._exploit(trial, run_name, outcome) or config
                seen.config = config
                outcome = self._run(self._plan(config, run_name, lease, callback))
            ended = self._finish(trial, seen, callback, outcome)
        except BaseException as exc:  # recorded with the trial; the search goes on
            ended = self._finish(trial, seen, callback, exc)
        finally:
            if population is not None:
                population.remove(run_name)
            self._book.release(lease.owner)
            self._ended.set()
        if ended is not None:
            self._events.ended(ended)
        else:
            self._events.left(seen)

    def _plan(
        self,
        config: dict[str, Any],
        run_name: str,
        lease: WorkerLease,
        callback: TrialCallback,
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
        except Stopped:
            return None
        except Exploiting as exc:  # the trial goes on from the donor's checkpoint
            return exc
        except RunCancelled as exc:  # stopped with the search: as told, or as it failed
            return None if self._stopping.is_set() else exc
        except BaseException as exc:
            return exc
        return None

    def _exploit(
        self, trial: optuna.Trial, run_name: str, exploiting: Exploiting
    ) -> dict[str, Any] | None:
        """Copy the donor's latest checkpoint in as the trial's; its new config (None: the
        copy failed, the trial goes on as it was)."""
        setup = self._setup
        assert setup.population is not None
        exploit = exploiting.exploit
        own = RunStorage(setup.filesystem, f"{setup.experiment_dir}/{run_name}")
        donor = RunStorage(setup.filesystem, f"{setup.experiment_dir}/{exploit.donor}")
        try:
            checkpoint_copy.adopt(own, donor, exploiting.index)
        except CheckpointError as exc:
            logger.warning("[exploit] trial %s goes on as it was: %s", run_name, exc)
            return None
        setup.population.exploited(run_name, exploit)
        self._study.set_config(trial, exploit.config)
        return exploit.config

    def _finish(
        self,
        trial: optuna.Trial,
        seen: Trial,
        callback: TrialCallback,
        error: BaseException | None,
    ) -> Trial | None:
        if isinstance(error, KeyboardInterrupt):
            return None  # left RUNNING: the next fit() with this name resumes it
        run_name = seen.name
        result = replace(callback.result or self._setup.no_result(), config=seen.config)
        if callback.reports:  # Ray's: with its auto-filled fields, across PBT's exploits
            history = [callback.reports[index] for index in sorted(callback.reports)]
            result = replace(result, metrics=result.metrics or history[-1], metrics_history=history)
        if callback.auto:  # Ray Tune's auto-filled fields, of the trial's last result
            auto = {**callback.auto, "done": error is None or isinstance(error, Pruned)}
            result = replace(result, metrics={**result.metrics, **auto})
        state, values = TrialState.COMPLETE, None
        if isinstance(error, Pruned):
            state, error = TrialState.PRUNED, None
        elif error is None:
            try:
                values = told_values(result.metrics, self._setup.told)
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
        self._study.finish(trial, state, values, result.metrics, error)
        seen.state, seen.result = state_name(state), result
        with self._lock:
            self.outcomes.append(seen)
        return seen

    def _not_enough_workers(self) -> NotEnoughWorkersError:
        needs = self._setup.needs(self._next[2] if self._next is not None else {})
        return worker_selection.shortage(self._client, needs, self._setup.worker_timeout_s)
