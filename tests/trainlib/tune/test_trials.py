"""The trial runner: trials as concurrent runs on the free workers, their end told to Optuna.

Each trial's run is a stand-in for ``run_training`` that hands scripted reports to the run's
callbacks as the engine does (and raises what a callback raises); the cluster's workers are a
fixed list. The Optuna study is real (a sqlite file).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from fsspec.implementations.local import LocalFileSystem
from optuna.trial import TrialState

from trainlib import (
    DaskConfig,
    NotEnoughWorkersError,
    Report,
    Result,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)
from trainlib._internal.driver import worker_selection
from trainlib._internal.driver.run_plan import RunPlan
from trainlib._internal.driver.run_record import RunCancelled
from trainlib.tune import _trials
from trainlib.tune._study import Study, StudySettings
from trainlib.tune._trials import TrialRunner
from trainlib.tune.callback import Callback, Trial
from trainlib.tune.search_events import SearchEvents
from trainlib.tune.stopper import Stopper, as_stopper
from trainlib.tune.trial_callback import TrialSetup

WAIT_S = 10.0
Engine = Callable[[RunPlan], list[dict[str, Any]]]  # a trial's run: the metrics it reports


class AlwaysPrune(optuna.pruners.BasePruner):
    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return True


class Seen(Callback):
    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[Trial] = []

    def on_trial_start(self, trial: Trial) -> None:
        self.started.append(trial.name)

    def on_trial_end(self, trial: Trial) -> None:
        self.ended.append(trial)


def fake_run_training(engine: Engine) -> Callable[[RunPlan, Any], Result]:
    """``run_training`` as the trials see it: reports reach the callbacks, in order; what a
    callback or the run raises ends the run, after ``on_end``."""

    def run(plan: RunPlan, client: Any) -> Result:
        callbacks = plan.run_config.callbacks
        history: list[dict[str, Any]] = []
        error: BaseException | None = None
        try:
            for index, metrics in enumerate(engine(plan)):
                history.append(metrics)
                for callback in callbacks:
                    callback.on_report(Report(index, metrics, None))
        except BaseException as exc:
            error = exc
        result = Result(
            metrics=history[-1] if history else {},
            checkpoint=None,
            best_checkpoints=[],
            path=plan.run_config.name or "",
            filesystem=LocalFileSystem(),
            error=error,
            metrics_history=history,
        )
        for callback in callbacks:
            callback.on_end(result)
        if error is not None:
            raise error
        return result

    return run


def search(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    engine: Engine,
    *,
    num_trials: int,
    num_workers: int = 1,
    cluster_size: int = 2,
    max_concurrent: int | None = None,
    max_t: int | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    callbacks: tuple[Callback, ...] = (),
    stopper: Stopper | None = None,
    fail_fast: bool | str = False,
) -> tuple[list[Trial], Study]:
    addresses = [f"tcp://w{i}" for i in range(cluster_size)]
    monkeypatch.setattr(worker_selection, "eligible_workers", lambda *args: addresses)
    monkeypatch.setattr(_trials, "run_training", fake_run_training(engine))
    study = Study.open(
        StudySettings(
            name="search",
            storage_url=f"sqlite:///{tmp_path / 'study.db'}",
            directions=["minimize"],
            sampler=optuna.samplers.RandomSampler(seed=0),
            pruner=pruner or optuna.pruners.NopPruner(),
        ),
        {"lr": optuna.distributions.FloatDistribution(0.01, 0.1)},
        [],
        num_trials,
    )
    plan = RunPlan(
        train_func_payload=b"",
        scaling=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(),
        torch_config=TorchConfig(),
        dask_config=DaskConfig(),
    )
    setup = TrialSetup(
        make_plan=lambda config: replace(plan, train_func_payload=repr(config).encode()),
        config_of=lambda params, name: dict(params),
        num_workers=num_workers,
        resources=None,
        experiment_dir=str(tmp_path),
        filesystem=LocalFileSystem(),
        metric="loss",
        max_t=max_t,
        max_concurrent=max_concurrent,
        worker_timeout_s=0.5,
        events=SearchEvents(list(callbacks), LocalFileSystem(), str(tmp_path)),
        stopper=stopper,
        fail_fast=fail_fast,
    )
    client = SimpleNamespace(scheduler=SimpleNamespace(address="tcp://scheduler"))
    runner = TrialRunner(client, study, setup)  # type: ignore[arg-type]
    return runner.run(num_trials), study


def reports(*losses: float) -> Engine:
    return lambda plan: [{"loss": loss} for loss in losses]


def states(study: Study) -> list[TrialState]:
    return [t.state for t in study._study.get_trials(deepcopy=False)]


def test_trials_run_at_once_on_disjoint_free_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lock = threading.Lock()
    held: dict[str, set[str]] = {}
    overlapping = threading.Barrier(2, timeout=WAIT_S)  # two trials must run at once
    most = [0]

    def engine(plan: RunPlan) -> list[dict[str, Any]]:
        assert plan.lease is not None
        mine = set(plan.lease.allowed([f"tcp://w{i}" for i in range(4)]))
        name = str(plan.run_config.name)
        assert len(mine) == 2  # reserved before the trial started
        with lock:
            assert all(not mine & theirs for theirs in held.values())
            held[name] = mine
            most[0] = max(most[0], len(held))
        overlapping.wait()
        with lock:
            del held[name]
        return [{"loss": 1.0}]

    ended, _ = search(monkeypatch, tmp_path, engine, num_trials=4, num_workers=2, cluster_size=4)
    assert most[0] == 2  # 4 workers, 2 a trial
    assert sorted(t.state for t in ended) == ["complete"] * 4


def test_trials_max_concurrent_trials_is_never_exceeded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    running = [0, 0]  # now, most
    lock = threading.Lock()

    def engine(plan: RunPlan) -> list[dict[str, Any]]:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        with lock:
            running[0] -= 1
        return [{"loss": 1.0}]

    ended, _ = search(monkeypatch, tmp_path, engine, num_trials=3, cluster_size=4, max_concurrent=1)
    assert running[1] == 1
    assert len(ended) == 3


def test_trials_pruned_trial_ends_pruned_in_optuna(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ended, study = search(
        monkeypatch, tmp_path, reports(3.0, 2.0, 1.0), num_trials=1, pruner=AlwaysPrune()
    )
    (trial,) = ended
    assert trial.state == "pruned"
    assert trial.result is not None and trial.result.error is None
    history = trial.result.metrics_history
    assert [(h["loss"], h["training_iteration"]) for h in history] == [(3.0, 1)]  # its first
    assert states(study) == [TrialState.PRUNED]


def test_trials_max_t_ends_a_trial_complete_with_its_last_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ended, study = search(monkeypatch, tmp_path, reports(3.0, 2.0, 1.0), num_trials=1, max_t=2)
    (trial,) = ended
    assert trial.state == "complete"
    assert trial.result is not None
    assert trial.result.metrics["loss"] == 2.0
    assert trial.result.metrics["training_iteration"] == 2
    assert study._study.trials[0].value == 2.0


def until_cancelled(plan: RunPlan) -> list[dict[str, Any]]:
    """A trial that reports nothing until the search cancels it, as the engine's poll does."""
    assert plan.cancel is not None
    assert plan.cancel.wait(WAIT_S), "the trial was never cancelled"
    raise RunCancelled("the search stopped")


def first_then_until_cancelled(first: Engine) -> tuple[Engine, list[str]]:
    """An engine whose first trial runs ``first`` and whose later ones report nothing until the
    search cancels them; and the names of the trials started."""
    started: list[str] = []
    lock = threading.Lock()

    def engine(plan: RunPlan) -> list[dict[str, Any]]:
        with lock:
            started.append(str(plan.run_config.name))
            is_first = len(started) == 1
        return first(plan) if is_first else until_cancelled(plan)

    return engine, started


def test_trials_stop_dict_ends_a_trial_complete_with_rays_auto_filled_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []

    def stop_fn(trial_id: str, result: dict[str, Any]) -> bool:
        seen.append(result)
        return result["training_iteration"] >= 2

    ended, study = search(
        monkeypatch, tmp_path, reports(3.0, 2.0, 1.0), num_trials=1, stopper=as_stopper(stop_fn)
    )
    (trial,) = ended
    assert trial.state == "complete"
    assert trial.result is not None
    assert [r["training_iteration"] for r in seen] == [1, 2]
    assert [r["trial_id"] for r in seen] == [trial.name] * 2
    metrics = trial.result.metrics
    assert metrics["loss"] == 2.0 and metrics["training_iteration"] == 2
    assert metrics["done"] is True and metrics["trial_id"] == trial.name
    assert metrics["time_total_s"] >= metrics["time_this_iter_s"] >= 0
    assert {"timestamp", "date"} <= set(metrics)
    assert study._study.trials[0].value == 2.0


def test_trials_stop_all_ends_running_trials_and_starts_no_more(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class StopAllAtFirstResult(Stopper):
        def __init__(self) -> None:
            self.should_stop = False

        def __call__(self, trial_id: str, result: dict) -> bool:
            self.should_stop = True
            return True

        def stop_all(self) -> bool:
            return self.should_stop

    engine, started = first_then_until_cancelled(reports(1.0))
    ended, study = search(
        monkeypatch,
        tmp_path,
        engine,
        num_trials=4,
        cluster_size=2,
        max_concurrent=2,
        stopper=StopAllAtFirstResult(),
    )
    assert len(started) <= 2  # no trial started after the stop
    assert all(t.result is not None and t.result.error is None for t in ended)
    assert TrialState.FAIL not in states(study)


@pytest.mark.parametrize("fail_fast", [True, "raise"])
def test_trials_fail_fast_stops_the_search_at_the_first_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail_fast: bool | str
) -> None:
    def failing(plan: RunPlan) -> list[dict[str, Any]]:
        raise RuntimeError("Failing (on purpose)!")

    engine, started = first_then_until_cancelled(failing)

    def run() -> tuple[list[Trial], Study]:
        return search(
            monkeypatch,
            tmp_path,
            engine,
            num_trials=4,
            cluster_size=2,
            max_concurrent=2,
            fail_fast=fail_fast,
        )

    if fail_fast == "raise":
        with pytest.raises(RuntimeError, match="on purpose"):
            run()
        return
    ended, _ = run()
    assert len(started) <= 2
    assert sorted(t.state for t in ended)[0] == "failed"
    assert [t.state for t in ended].count("failed") == 1  # the others stopped, not failed


def test_trials_failed_trial_is_recorded_and_the_search_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = [0]

    def engine(plan: RunPlan) -> list[dict[str, Any]]:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("rank 0 failed")
        return [{"loss": 1.0}]

    ended, study = search(monkeypatch, tmp_path, engine, num_trials=2, max_concurrent=1)
    assert [t.state for t in ended] == ["failed", "complete"]
    assert ended[0].result is not None
    assert isinstance(ended[0].result.error, RuntimeError)
    assert states(study) == [TrialState.FAIL, TrialState.COMPLETE]


def test_trials_trial_without_the_metric_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ended, _ = search(monkeypatch, tmp_path, lambda plan: [{"accuracy": 0.5}], num_trials=1)
    (trial,) = ended
    assert trial.state == "failed"
    assert trial.result is not None
    assert "without the metric 'loss'" in str(trial.result.error)


def test_trials_interrupted_trial_stays_running_for_the_next_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def interrupted(plan: RunPlan) -> list[dict[str, Any]]:
        raise KeyboardInterrupt

    ended, study = search(monkeypatch, tmp_path, interrupted, num_trials=1)
    assert ended == []
    assert states(study) == [TrialState.RUNNING]


def test_trials_search_callbacks_see_each_trial_start_and_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = Seen()
    search(monkeypatch, tmp_path, reports(1.0), num_trials=2, callbacks=(seen,))
    assert sorted(seen.started) == ["trial_00000", "trial_00001"]
    assert sorted((t.name, t.state) for t in seen.ended) == [
        ("trial_00000", "complete"),
        ("trial_00001", "complete"),
    ]


def test_trials_too_few_workers_for_one_trial_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(NotEnoughWorkersError) as raised:
        search(monkeypatch, tmp_path, reports(1.0), num_trials=1, num_workers=3)
    assert raised.value.requested == 3
    assert raised.value.available == 2
    assert "tcp://scheduler" in str(raised.value)


def test_study_a_resumed_trial_gets_the_config_pbt_gave_it(tmp_path: Path) -> None:
    """A trial interrupted after PBT changed its config resumes (same run name) with that
    config, not the one its parameters would make."""
    settings = StudySettings(
        name="pbt",
        storage_url=f"sqlite:///{tmp_path / 'study.db'}",
        directions=["maximize"],
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.NopPruner(),
    )
    distributions = {"lr": optuna.distributions.FloatDistribution(0.01, 0.1)}
    study = Study.open(settings, distributions, [], 1)
    trial, name, new = study.ask("trial_{:05d}")
    assert new
    assert study.config(trial) is None
    study.set_config(trial, {"lr": 0.5, "note": "explored"})
    study.set_config(trial, {"lr": object()})  # not JSON: the last one JSON could hold stays
    reopened = Study.open(settings, distributions, [], 1)  # as the next fit() opens it
    resumed, same_name, new = reopened.ask("trial_{:05d}")
    assert same_name == name and resumed.number != trial.number and not new
    assert reopened.config(resumed) == {"lr": 0.5, "note": "explored"}
