"""The tune-cifar search space parameter (JSON in, trainlib.tune domains out) and the search a
try of the tune task runs (a stored one of its name resumed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cifar.errors import InvalidParameterError
from tasks.search_space import DEFAULT_SEARCH_SPACE, search_space
from trainlib import tune


def test_search_space_default_covers_lr_batch_size_and_model() -> None:
    space = search_space(DEFAULT_SEARCH_SPACE)
    assert space["lr"] == tune.loguniform(0.01, 0.3)
    assert space["batch_size"] == tune.choice([128, 256])
    assert space["model"] == tune.choice(["small_cnn"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"learning_rate": ["uniform", 0.1, 0.2]}, "use a TrainConfig field"),
        ({"lr": ["gaussian", 0.1, 0.2]}, "kind one of uniform"),
        ({"lr": ["loguniform", 0.0, 0.2]}, "lower > 0"),
    ],
)
def test_search_space_mistakes_name_the_fix(spec: dict[str, list[object]], message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        search_space(spec)


def test_tune_task_resumes_a_stored_search_of_its_name_with_its_own_tracker(
    tmp_path: Path,
) -> None:
    """A retried task (or the flow run again with the same name) restores the search stored
    under its name, going on with this try's tracker; a name with no search makes a new one."""
    from types import SimpleNamespace

    import trainlib
    from tasks.tune import _tuner
    from trainlib import RunConfig, ScalingConfig, tune
    from trainlib._internal.common.storage import RunStorage
    from trainlib.torch import TorchTrainer
    from trainlib.tune import saved_search

    trainer = TorchTrainer(lambda config: None, scaling_config=ScalingConfig(num_workers=1))
    request = SimpleNamespace(
        layout=SimpleNamespace(runs=str(tmp_path)),
        name="search-a",
        num_samples=3,
        max_concurrent_trials=1,
        base=SimpleNamespace(epochs=2),
        study_storage=None,
    )
    tracker = trainlib.Callback()
    fresh = _tuner(request, trainer, {"lr": tune.uniform(0.01, 0.1)}, tracker)  # type: ignore[arg-type]
    assert fresh._search is None and fresh._run_config.callbacks == [tracker]
    experiment = RunStorage.create(str(tmp_path), "search-a", None)
    stored = tune.TuneConfig(metric="val_accuracy", mode="max", num_samples=7)
    saved_search.save(
        experiment, saved_search.Search("search-a", 1), {}, stored, RunConfig(name="search-a")
    )
    again = trainlib.Callback()
    resumed = _tuner(request, trainer, {"lr": tune.uniform(0.01, 0.1)}, again)  # type: ignore[arg-type]
    assert resumed._search == saved_search.Search("search-a", 1)
    assert resumed._tune_config.num_samples == 7  # the stored search's
    assert resumed._run_config.callbacks == [again]
    assert resumed._run_config.name == "search-a"
