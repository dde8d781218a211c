"""The stoppers of ``trainlib.tune.stopper``, as Ray Tune's: each fed results as a search
feeds them (trial id, result with ``training_iteration``)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from trainlib import ConfigError, RunConfig
from trainlib.tune.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    NoopStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
    as_stopper,
)


def feed(stopper: Stopper, trial_id: str, values: list[float], metric: str = "loss") -> int | None:
    """The iteration (1-based) at which ``stopper`` stops the trial; None if it never does."""
    for iteration, value in enumerate(values, start=1):
        if stopper(trial_id, {metric: value, "training_iteration": iteration}):
            return iteration
    return None


def test_stopper_dict_stops_once_any_result_reaches_its_value() -> None:
    stopper = as_stopper({"training_iteration": 10, "mean_accuracy": 0.8})
    assert stopper is not None
    accuracies = [min(i / 10, 1.0) for i in range(1, 20)]
    assert feed(stopper, "t0", accuracies, metric="mean_accuracy") == 8
    assert feed(stopper, "t1", [0.0] * 20, metric="mean_accuracy") == 10
    assert not stopper.stop_all()


def test_stopper_dict_naming_a_missing_result_says_which_there_are() -> None:
    stopper = as_stopper({"mean_acc": 0.8})
    assert stopper is not None
    with pytest.raises(
        ConfigError, match=r"no 'mean_acc'; it has \['loss', 'training_iteration'\]"
    ):
        stopper("t0", {"loss": 1.0, "training_iteration": 1})


@pytest.mark.parametrize("stop", [42, "training_iteration", {"loss": "low"}])
def test_stopper_of_a_wrong_kind_is_refused(stop: Any) -> None:
    with pytest.raises(ConfigError, match="stop="):
        as_stopper(stop)


def test_stopper_function_sees_every_result() -> None:
    seen: list[tuple[str, int]] = []

    def stop_fn(trial_id: str, result: dict) -> bool:
        seen.append((trial_id, result["training_iteration"]))
        return result["training_iteration"] >= 3

    stopper = as_stopper(stop_fn)
    assert isinstance(stopper, FunctionStopper)
    assert feed(stopper, "a", [1.0] * 5) == 3
    assert seen == [("a", 1), ("a", 2), ("a", 3)]


def test_stopper_maximum_iteration_counts_each_trial_apart() -> None:
    stopper = MaximumIterationStopper(max_iter=3)
    assert stopper("a", {}) is False
    assert stopper("b", {}) is False
    assert stopper("a", {}) is False
    assert stopper("a", {}) is True
    assert stopper("b", {}) is False


def test_stopper_trial_plateau_waits_for_grace_window_and_threshold() -> None:
    flat = [1.0, 0.5, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    assert feed(TrialPlateauStopper("loss", num_results=3, grace_period=1), "a", flat) == 5
    assert feed(TrialPlateauStopper("loss", num_results=3, grace_period=7), "a", flat) == 7
    # the plateau is above the threshold a loss must reach first
    threshold = TrialPlateauStopper("loss", num_results=3, metric_threshold=0.2, mode="min")
    assert feed(threshold, "a", flat) is None
    with pytest.raises(ConfigError, match="needs mode="):
        TrialPlateauStopper("loss", metric_threshold=0.2)


def test_stopper_experiment_plateau_stops_all_after_patience() -> None:
    stopper = ExperimentPlateauStopper("loss", std=0.01, top=3, mode="min", patience=2)
    results = [("a", 1.0), ("b", 0.5), ("a", 0.5), ("b", 0.5), ("a", 0.5)]
    decisions = [stopper(trial, {"loss": value}) for trial, value in results]
    # the top three are 0.5 from the 4th result (plateaued once), still at the 5th (twice)
    assert decisions == [False, False, False, False, True]
    assert stopper.stop_all()


def test_stopper_timeout_counts_from_the_first_result() -> None:
    stopper = TimeoutStopper(timedelta(seconds=0.05))
    time.sleep(0.1)  # start-up: not charged
    assert stopper.stop_all() is False
    assert stopper("a", {}) is False  # the clock starts here; it stops the search, not a trial
    deadline = time.monotonic() + 5
    while not stopper.stop_all():
        assert time.monotonic() < deadline
    with pytest.raises(ConfigError, match="positive"):
        TimeoutStopper(0)


def test_stopper_combined_asks_every_stopper() -> None:
    counted = MaximumIterationStopper(max_iter=2)
    combined = CombinedStopper(FunctionStopper(lambda trial_id, result: True), counted)
    assert combined("a", {}) is True
    assert combined("a", {}) is True
    assert counted._seen["a"] == 2  # the second stopper saw both results
    assert not CombinedStopper(NoopStopper()).stop_all()


def test_stopper_run_config_takes_a_stop_and_a_plain_trainer_refuses_it() -> None:
    from trainlib import ScalingConfig
    from trainlib.torch import TorchTrainer

    run_config = RunConfig(stop={"training_iteration": 2})
    trainer = TorchTrainer(
        lambda: None, scaling_config=ScalingConfig(num_workers=0), run_config=run_config
    )
    with pytest.raises(ConfigError, match="stops the trials of a search"):
        trainer.fit()
