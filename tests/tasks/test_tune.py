"""The tune-cifar search space parameter: JSON in, trainlib.tune domains out."""

from __future__ import annotations

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
