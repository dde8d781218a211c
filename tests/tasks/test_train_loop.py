"""The per-rank loop's pure pieces: its config, what ranks receive, the divergence stop."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from tasks.errors import InvalidParameterError, TrainingDivergedError
from tasks.model_checkpoint import ModelSpec
from tasks.train_loop import TrainConfig, _train_epoch, loop_config

SPEC = ModelSpec("small_cnn", (0.4, 0.5, 0.6), (0.2, 0.2, 0.2))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"epochs": 0}, "epochs=0 and batch_size=256 must be at least 1"),
        ({"batch_size": 0}, "epochs=5 and batch_size=0 must be at least 1"),
        ({"lr": -0.1}, "lr=-0.1 a finite number >= 0"),
        ({"lr": math.nan}, "lr=nan a finite number >= 0"),
    ],
)
def test_train_loop_config_names_the_bad_value(fields: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        TrainConfig(**fields)  # type: ignore[arg-type]


def test_train_loop_config_accepts_a_zero_learning_rate() -> None:
    assert TrainConfig(lr=0.0).lr == 0.0


def test_train_loop_config_is_plain_data_that_rebuilds_both_configs() -> None:
    config = TrainConfig(model="resnet18", epochs=2, lr=0.1, seed=3)
    loop = pickle.loads(pickle.dumps(loop_config(config, SPEC, train_rows=500)))
    assert TrainConfig(**loop["hyperparameters"]) == config
    assert ModelSpec(**loop["model_spec"]) == SPEC
    assert loop["train_rows"] == 500


def test_train_loop_stops_at_the_first_non_finite_loss_without_a_step() -> None:
    torch.manual_seed(0)
    model = SPEC.build()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batch = {"image": torch.full((2, 3, 32, 32), math.nan), "label": torch.tensor([0, 1])}
    with pytest.raises(
        TrainingDivergedError,
        match=r"loss became nan at epoch 3, step 1 \(lr=0.05\).*\(e\.g\. lr=0\.005\)",
    ):
        _train_epoch(model, [batch], optimizer, None, TrainConfig(lr=0.05), epoch=2)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
