"""The training checkpoint file: saved by rank 0, loaded as plain tensors, rebuilt as a model."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from cifar.checkpoint import (
    CHECKPOINT_FILE,
    ModelSpec,
    load_classifier,
    load_training_state,
    save_training_state,
)


def test_model_checkpoint_round_trip_rebuilds_the_classifier(tmp_path: Path) -> None:
    spec = ModelSpec("small_cnn", (0.4, 0.5, 0.6), (0.2, 0.2, 0.2))
    model = spec.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    save_training_state(
        str(tmp_path),
        model=model,
        spec=spec,
        optimizer=optimizer,
        scheduler=scheduler,
        epoch=3,
        hyperparameters={"lr": 0.1},
    )
    assert load_training_state(str(tmp_path))["epoch"] == 3
    loaded = load_classifier(str(tmp_path))
    assert not loaded.training
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_model_checkpoint_refuses_pickled_code(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("code ran",))

    (tmp_path / CHECKPOINT_FILE).write_bytes(pickle.dumps({"epoch": 1, "x": Payload()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_training_state(str(tmp_path))
