"""The per-rank loop's pure pieces: its config, what ranks receive, the divergence stop."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from cifar import train_loop
from cifar.errors import InvalidParameterError, TrainingDivergedError
from cifar.models import ModelSpec
from cifar.train_loop import TrainConfig, _train_epoch, loop_config

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
    config = TrainConfig(model="resnet18", epochs=2, lr=0.1, seed=3, compile=True)
    loop = pickle.loads(pickle.dumps(loop_config(config, SPEC, train_rows=500)))
    assert TrainConfig(**loop["hyperparameters"]) == config
    assert ModelSpec(**loop["model_spec"]) == SPEC
    assert loop["train_rows"] == 500


def _diverging_epoch(losses_nan_at: set[int], num_batches: int) -> None:
    """One pass of ``num_batches`` batches whose images are NaN at the given 1-based steps."""
    torch.manual_seed(0)
    model = SPEC.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batches = [
        {
            "image": torch.full((2, 3, 32, 32), math.nan if step in losses_nan_at else 0.5),
            "label": torch.tensor([0, 1]),
        }
        for step in range(1, num_batches + 1)
    ]
    scaler = torch.amp.GradScaler("cuda", enabled=False)  # as on a CPU rank
    _train_epoch(model, batches, optimizer, scheduler, scaler, TrainConfig(lr=0.05), epoch=2)


def test_train_loop_stops_at_a_non_finite_loss_naming_epoch_and_step() -> None:
    with pytest.raises(
        TrainingDivergedError,
        match=r"loss became nan at epoch 3, step 1 \(lr=0.05\).*\(e\.g\. lr=0\.005\)",
    ):
        _diverging_epoch({1}, num_batches=1)


def test_train_loop_names_the_steps_since_its_last_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_loop, "CHECK_EVERY_STEPS", 2)
    with pytest.raises(TrainingDivergedError, match=r"at epoch 3, steps 3-4 \(lr"):
        _diverging_epoch({3}, num_batches=5)  # steps 1-2 were checked, 3-4 are the range


def test_train_loop_does_not_advance_the_schedule_on_steps_the_scaler_skipped() -> None:
    """fp16's GradScaler skips steps whose scaled gradients overflow; the learning rate must
    not move on those steps (a CPU scaler stands in for the GPU's: the loop's code is shared).
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    # Weight gradients up to ~4 (pixels of 8, two images): scaled by 2**127 they overflow
    # float32 (max ~2**128) until the scale has backed off a few times.
    start = 2.0**127
    scaler = torch.amp.GradScaler("cpu", init_scale=start)
    batches = [{"image": torch.full((2, 3, 32, 32), 8.0), "label": torch.tensor([0, 1])}] * 8
    torch.distributed.init_process_group(
        "gloo", store=torch.distributed.HashStore(), rank=0, world_size=1
    )
    try:
        _train_epoch(model, batches, optimizer, scheduler, scaler, TrainConfig(lr=0.05), epoch=0)
    finally:
        torch.distributed.destroy_process_group()
    skipped = round(math.log2(start / scaler.get_scale()))  # each skip halves the scale
    assert 1 <= skipped < 8
    assert scheduler.last_epoch == 8 - skipped
