"""Tuner on a real 2-worker LocalCluster: trials share the workers, pruned trials free them,
failed trials are recorded, a search resumes, and each trial's ranks are fresh processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

from tests.helpers import rank_processes
from tests.trainlib.tune.trainables import (
    CountingTrainable,
    count_and_report,
    fail_when_told,
    fail_while_flagged,
    interrupted_once,
    record_and_meet_a_partner,
    report_epochs,
    report_threads,
    report_tune_context,
    report_until_pruned,
    start_a_train_run,
    write_and_report_nothing,
)
from trainlib import ConfigError, FailureConfig, RunConfig, ScalingConfig, tune
from trainlib.torch import TorchTrainer


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def test_tuner_runs_as_many_trials_at_once_as_free_workers(
    dask_client: Client, tmp_path: Path
) -> None:
    grid = tune.Tuner(
        record_and_meet_a_partner,
        param_space={"x": tune.grid_search([1, 2, 3, 4]), "out": str(tmp_path)},
        tune_config=tune.TuneConfig(
            metric="score", mode="max", max_concurrent_trials=4, scheduler=tune.FIFOScheduler()
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    # A trial fails if the trial it pairs with (by start order) does not start while it runs.
    assert grid.trial_states == ["complete"] * 4, grid.errors
    assert grid.get_best_result().config["x"] == 4
    events = _events(tmp_path)
    start = {e["x"]: e["time"] for e in events if e["event"] == "start"}
    end = {e["x"]: e["time"] for e in events if e["event"] == "end"}
    by_number = {e["number"]: e["x"] for e in events if e["event"] == "start"}
    assert sorted(by_number) == [0, 1, 2, 3]
    for first, second in [(by_number[0], by_number[1]), (by_number[2], by_number[3])]:
        assert max(start[first], start[second]) < min(end[first], end[second])  # they overlapped
    running_at_each_start = [sum(start[y] <= start[x] < end[y] for y in start) for x in start]
    assert max(running_at_each_start) == 2  # 1-rank trials on 2 workers: 2 at once, never 3
    assert len({e["pid"] for e in events}) == 4  # every trial's rank is a fresh process
    assert [e["left"] for e in events if e["event"] == "start"] == [None] * 4
    assert rank_processes() == []


def test_tuner_pruned_trial_stops_its_ranks_and_frees_its_workers(
    dask_client: Client, tmp_path: Path
) -> None:
    trainer = TorchTrainer(
        report_until_pruned,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),  # each trial holds both workers
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"x": tune.grid_search([1.0, 0.0, 2.0])}},
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            max_concurrent_trials=3,
            scheduler=tune.ASHAScheduler(grace_period=1, reduction_factor=2),
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert grid.trial_states == ["complete", "pruned", "complete"]
    pruned = grid[1]
    assert pruned.error is None and len(pruned.metrics_history) < 10
    events = _events(tmp_path)
    # Its ranks were stopped mid-loop (a rank reporting every 0.1 s once outran the stop
    # check and ran all 100 steps, until the driver gave up waiting and freed its workers).
    assert max(e["step"] for e in events if e["x"] == 0.0) < 99
    last_pruned_report = max(e["time"] for e in events if e["x"] == 0.0)
    first_next_report = min(e["time"] for e in events if e["x"] == 2.0)
    assert first_next_report > last_pruned_report  # the next trial waited for the workers
    assert rank_processes() == []


def test_median_stopping_rule_stops_a_trial_below_the_median(
    dask_client: Client, tmp_path: Path
) -> None:
    grid = tune.Tuner(
        report_until_pruned,
        param_space={"x": tune.grid_search([1.0, 2.0, 0.0]), "out": str(tmp_path)},
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            max_concurrent_trials=1,  # the two others have ended when x == 0 reports
            scheduler=tune.MedianStoppingRule(grace_period=1, min_samples_required=2),
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert grid.trial_states == ["complete", "complete", "pruned"]
    assert len(grid[2].metrics_history) < 10  # of the 100 steps x == 0 would run
    assert rank_processes() == []


def test_scheduler_counts_progress_in_its_time_attr(dask_client: Client, tmp_path: Path) -> None:
    """Ray's ASHAScheduler(time_attr="epoch", max_t=6): a trial reporting epochs 2, 4, 6 ...
    ends at epoch 6, its third report; a trial whose results lack the epoch fails saying so.
    Every trial scores the same, so the pruner, told epochs, keeps each at every rung."""
    grid = tune.Tuner(
        report_epochs,
        param_space={
            "x": 1.0,
            "copy": tune.grid_search([0, 1]),
            "no_epoch": tune.grid_search([False, True]),
        },
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            scheduler=tune.ASHAScheduler(time_attr="epoch", max_t=6, grace_period=2),
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    by_config = {(r.config["copy"], r.config["no_epoch"]): r for r in grid}
    for copy in (0, 1):
        kept = by_config[(copy, False)]
        assert kept.error is None
        assert [m["epoch"] for m in kept.metrics_history] == [2, 4, 6]
        failed = by_config[(copy, True)]
        assert "time_attr='epoch' is not a number in this result" in str(failed.error)
    assert rank_processes() == []


def test_trial_dirname_creator_names_each_trial_and_its_directory(
    dask_client: Client, tmp_path: Path
) -> None:
    """Ray's TuneConfig(trial_dirname_creator=, trial_name_creator=): each new trial's run
    directory (and name) is what the creator returns for it; a restored search finds them;
    a creator naming two trials alike stops the search saying so."""

    def named(trial: tune.Trial) -> str:
        return f"{trial.trainable_name}_x={trial.config['x']}"

    grid = tune.Tuner(
        count_and_report,
        param_space={"x": tune.grid_search([1, 2]), "out": str(tmp_path)},
        tune_config=tune.TuneConfig(metric="score", mode="max", trial_dirname_creator=named),
        run_config=RunConfig(name="named", storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    names = sorted(Path(r.path).name for r in grid)
    assert names == ["count_and_report_x=1", "count_and_report_x=2"]
    assert all((tmp_path / "runs" / "named" / name).is_dir() for name in names)
    restored = tune.Tuner.restore(str(tmp_path / "runs" / "named"), count_and_report)
    assert sorted(Path(r.path).name for r in restored.get_results()) == names
    assert restored.get_results().get_best_result().config["x"] == 2

    with pytest.raises(ConfigError, match=r"both 'same': include trial\.trial_id"):
        tune.Tuner(
            count_and_report,
            param_space={"x": tune.grid_search([1, 2]), "out": str(tmp_path)},
            tune_config=tune.TuneConfig(trial_name_creator=lambda trial: "same"),
            run_config=RunConfig(name="alike", storage_path=str(tmp_path / "runs")),
            client=dask_client,
        ).fit()
    with pytest.raises(ConfigError, match="must return a non-empty str without '/'"):
        tune.Tuner(
            count_and_report,
            param_space={"x": 1, "out": str(tmp_path)},
            tune_config=tune.TuneConfig(trial_name_creator=lambda trial: "a/b"),
            run_config=RunConfig(name="slash", storage_path=str(tmp_path / "runs")),
            client=dask_client,
        ).fit()
    assert rank_processes() == []


class TrialLog(tune.Callback):
    """Records every trial's state as it starts and ends."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def on_trial_start(self, trial: tune.Trial) -> None:
        self.seen.append((trial.number, trial.state))

    def on_trial_end(self, trial: tune.Trial) -> None:
        self.seen.append((trial.number, trial.state))


def test_tuner_failed_trial_is_recorded_and_the_search_goes_on(
    dask_client: Client, tmp_path: Path
) -> None:
    trial_log = TrialLog()
    grid = tune.Tuner(
        fail_when_told,
        param_space={"x": tune.grid_search(["ok", "bad", "flaky"]), "out": str(tmp_path)},
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
        run_config=RunConfig(
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[trial_log],
        ),
        client=dask_client,
    ).fit()
    assert grid.trial_states == ["complete", "failed", "complete"]
    assert grid.num_errors == 1
    assert "trial bad broke" in str(grid.errors[0])
    assert grid[2].num_restarts == 1  # max_failures applies per trial
    assert grid.get_dataframe()["state"].tolist() == ["complete", "failed", "complete"]
    assert trial_log.seen == [
        (0, "running"),
        (0, "complete"),
        (1, "running"),
        (1, "failed"),
        (2, "running"),
        (2, "complete"),
    ]
    assert rank_processes() == []


def _resumable_tuner(client: Client, out: Path) -> tune.Tuner:
    return tune.Tuner(
        interrupted_once,
        param_space={
            "x": tune.grid_search([1, 2]),
            "out": str(out),
            "driver_pid": os.getpid(),
        },
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
        run_config=RunConfig(name="resumable", storage_path=str(out / "runs")),
        client=client,
    )


def test_tuner_restore_resumes_after_ctrl_c(dask_client: Client, tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        _resumable_tuner(dask_client, tmp_path).fit()
    assert rank_processes() == []  # Ctrl-C stopped the running trial's ranks
    path = str(tmp_path / "runs" / "resumable")
    grid = tune.Tuner.restore(path, interrupted_once, client=dask_client).fit()
    assert grid.trial_states == ["complete", "complete"]
    assert [r.config["x"] for r in grid] == [1, 2]
    starts = [(e["x"], e["epoch"]) for e in _events(tmp_path) if e["event"] == "start"]
    assert starts == [(1, 0), (2, 0), (2, 1)]  # trial 1 not re-run; trial 2 resumed at epoch 1
    assert grid[1].checkpoint is not None
    assert rank_processes() == []


def test_tuner_ray_names_tune_run_config_search_paths_and_trial_context(
    dask_client: Client, tmp_path: Path
) -> None:
    """Ray Tune's import paths and names: tune.RunConfig, tune.FailureConfig, the searchers'
    modules, and tune.get_context() inside a trial."""
    from trainlib.tune.search.basic_variant import BasicVariantGenerator
    from trainlib.tune.search.optuna import OptunaSearch

    assert OptunaSearch is tune.OptunaSearch and BasicVariantGenerator is tune.BasicVariantGenerator
    grid = tune.Tuner(
        report_tune_context,
        param_space={"x": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(
            metric="score", mode="max", max_concurrent_trials=1, search_alg=OptunaSearch(seed=0)
        ),
        run_config=tune.RunConfig(
            name="named",
            storage_path=str(tmp_path / "runs"),
            failure_config=tune.FailureConfig(max_failures=0),
        ),
        client=dask_client,
    ).fit()
    frame = grid.get_dataframe().sort_values("score")
    assert frame["trial_name"].tolist() == ["trial_00000", "trial_00001"]
    assert frame["trial_id"].tolist() == frame["trial_name"].tolist()
    assert (frame["time_total_s"] > 0).all()
    assert frame["experiment"].tolist() == ["named", "named"]
    assert [Path(d) for d in frame["trial_dir"]] == [
        tmp_path / "runs" / "named" / name for name in frame["trial_name"]
    ]


def test_tuner_without_a_metric_runs_trials_that_report_nothing(
    dask_client: Client, tmp_path: Path
) -> None:
    """Ray's Tuner(trainable, param_space=...) with no TuneConfig: every trial runs, none is
    compared, and reporting nothing is no failure."""
    grid = tune.Tuner(
        write_and_report_nothing,
        param_space={"x": tune.grid_search(["a", "b"]), "out": str(tmp_path)},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert grid.trial_states == ["complete", "complete"] and grid.num_errors == 0
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-a", "ran-b"]
    with pytest.raises(ConfigError, match="needs the metric to compare the trials on"):
        grid.get_best_result()


def test_tuner_with_resources_runs_each_trial_on_the_cpus_asked_for(
    dask_client: Client, tmp_path: Path
) -> None:
    """Ray's tune.with_resources(train_fn, {"cpu": 1}) as written: every trial's rank runs on
    one thread (a rank on this 2-worker cluster would take the host's cores otherwise)."""
    grid = tune.Tuner(
        tune.with_resources(report_threads, {"cpu": 1}),
        param_space={"x": tune.grid_search([1, 2])},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert sorted(r.metrics["x"] for r in grid) == [1, 2]
    assert [r.metrics["threads"] for r in grid] == [1, 1]


def test_tuner_trials_that_start_train_runs_place_them_on_the_tuners_cluster(
    dask_client: Client, tmp_path: Path
) -> None:
    """Ray Train v2 with Tune: each trial's TorchTrainer (DaskConfig() by default) runs its
    ranks on the cluster the search runs on, and its reports reach the Tuner."""
    grid = tune.Tuner(
        start_a_train_run,
        param_space={"storage": str(tmp_path / "train"), "x": tune.grid_search([1, 2])},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert dask_client.scheduler is not None
    assert [r.metrics["scheduler"] for r in grid] == [dask_client.scheduler.address] * 2
    assert [r.metrics["world_size"] for r in grid] == [2, 2]
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == [
        "train-trial_00000",
        "train-trial_00001",
    ]


def test_tuner_restore_resumes_a_search_from_its_directory(
    dask_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's Tuner.restore(path, trainable): the search's space and configs come back from
    its directory; trials that ended are kept, not run again, and the rest run."""
    experiment = tmp_path / "runs" / "restorable"
    assert not tune.Tuner.can_restore(str(experiment))
    tune.Tuner(
        count_and_report,
        param_space={"x": tune.grid_search([1, 2]), "out": str(tmp_path)},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="restorable", storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert tune.Tuner.can_restore(str(experiment))
    stored = tune.Tuner.restore(str(experiment), count_and_report).get_results()  # no fit()
    assert sorted(r.metrics["score"] for r in stored) == [1, 2]
    monkeypatch.setenv("HOME", str(tmp_path))  # a path as Ray's pages write it: ~/...
    assert tune.Tuner.can_restore("~/runs/restorable")
    at_home = tune.Tuner.restore("~/runs/restorable", count_and_report).get_results()
    assert sorted(r.metrics["score"] for r in at_home) == [1, 2]
    restored = tune.Tuner.restore(str(experiment), count_and_report, client=dask_client)
    grid = restored.fit()
    assert restored.get_results() is grid
    assert sorted(r.metrics["score"] for r in grid) == [1, 2]
    assert grid.get_best_result().config["x"] == 2  # the saved TuneConfig's metric and mode
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["1", "2"]  # none ran again
    with pytest.raises(ConfigError, match="choose one"):
        tune.Tuner.restore(
            str(experiment), count_and_report, resume_errored=True, restart_errored=True
        )
    with pytest.raises(ConfigError, match="no search is stored there"):
        tune.Tuner.restore(str(tmp_path / "nothing"), count_and_report)
    with pytest.raises(ConfigError, match="call fit"):
        tune.Tuner(count_and_report, client=dask_client).get_results()


def test_a_new_tuner_of_the_same_name_runs_a_search_of_its_own(
    dask_client: Client, tmp_path: Path
) -> None:
    """As in Ray: a second Tuner named as the first runs all its trials, in directories beside
    the first's; Tuner.restore and get_results take the latest search."""

    def tuner(xs: list[int]) -> tune.Tuner:
        return tune.Tuner(
            count_and_report,
            param_space={"x": tune.grid_search(xs), "out": str(tmp_path)},
            tune_config=tune.TuneConfig(metric="score", mode="max"),
            run_config=tune.RunConfig(name="twice", storage_path=str(tmp_path / "runs")),
            client=dask_client,
        )

    first = tuner([1, 2]).fit()
    second = tuner([3]).fit()
    assert sorted(r.config["x"] for r in first) == [1, 2]
    assert [r.config["x"] for r in second] == [3]
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["1", "2", "3"]  # once each
    experiment = tmp_path / "runs" / "twice"
    trials = {p.name for p in experiment.iterdir() if p.name.startswith("trial_")}
    assert trials == {"trial_00000", "trial_00001", "trial_2_00000"}
    restored = tune.Tuner.restore(str(experiment), count_and_report).get_results()
    assert [r.config["x"] for r in restored] == [3]
    assert [r.config["x"] for r in tuner([9]).get_results()] == [3]  # not fit: the latest
    resumed = tune.run(  # Ray's older form: resume="AUTO" goes on with the stored search
        count_and_report,
        config={"x": tune.grid_search([4]), "out": str(tmp_path)},
        metric="score",
        mode="max",
        name="twice",
        storage_path=str(tmp_path / "runs"),
        resume="AUTO",
        client=dask_client,
    )
    assert [r.config["x"] for r in resumed] == [3]
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["1", "2", "3"]  # no new run
    with pytest.raises(ConfigError, match="no search is stored under name='never'"):
        tune.run(count_and_report, name="never", storage_path=str(tmp_path), resume=True)


@pytest.mark.parametrize("how", ["resume_errored", "restart_errored"])
def test_tuner_restore_runs_failed_trials_again_when_asked(
    dask_client: Client, tmp_path: Path, how: str
) -> None:
    """Ray's Tuner.restore(path, trainable, resume_errored=True | restart_errored=True): the
    failed trial runs again (resumed in its own run, or restarted under a new name); the
    trials that completed do not."""
    (tmp_path / "fail-2").touch()
    first = tune.Tuner(
        fail_while_flagged,
        param_space={"x": tune.grid_search([1, 2]), "out": str(tmp_path)},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=tune.FIFOScheduler()),
        run_config=tune.RunConfig(name="errored", storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert sorted(first.trial_states) == ["complete", "failed"]
    failed_name = next(r.metrics["trial"] for r in first if r.error is not None)
    (tmp_path / "fail-2").unlink()
    experiment = str(tmp_path / "runs" / "errored")
    again = tune.Tuner.restore(experiment, fail_while_flagged, client=dask_client, **{how: True})
    grid = again.fit()
    assert grid.trial_states == ["complete", "complete"], grid.errors
    rerun = next(r for r in grid if r.config["x"] == 2)
    same_run = rerun.metrics["trial"] == failed_name
    assert same_run == (how == "resume_errored")
    assert len(tune.Tuner.restore(experiment, fail_while_flagged).get_results()) == 2


def test_tuner_class_trainable_checkpoints_and_resumes_after_a_failure(
    dask_client: Client, tmp_path: Path
) -> None:
    """A tune.Trainable's checkpoints are trainlib checkpoints: every 2 steps and at its end;
    after its rank dies at step 4 the run restarts from step 2's, load_checkpoint restores
    the count and the iteration, and the trial ends complete after 6 steps."""
    grid = tune.Tuner(
        CountingTrainable,
        param_space={"out": str(tmp_path)},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "runs"),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=True),
            failure_config=tune.FailureConfig(max_failures=1),
        ),
        client=dask_client,
    ).fit()
    (result,) = grid
    assert result.error is None, result.error
    assert (tmp_path / "loaded").read_text() == "2 at iteration 2"
    assert result.metrics["total"] == 6
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert (Path(directory) / "total").read_text() == "6"
