"""The training checkpoint file: saved by rank 0, loaded as plain tensors, rebuilt as a model."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from cifar.checkpoint import (
    CHECKPOINT_FILE,
    load_classifier,
    load_training_state,
    restore_training_state,
    save_training_state,
)
from cifar.models import ModelSpec


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


SPEC = ModelSpec("small_cnn", (0.5,) * 3, (0.25,) * 3)


def _training_objects() -> tuple[
    torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler
]:
    model = SPEC.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def _save(
    directory: Path,
    objects: tuple[torch.nn.Module, torch.optim.Optimizer, Any],
    scaler: torch.amp.GradScaler,
    epoch: int = 0,
) -> str:
    """``checkpoint.pt`` of the training ``objects`` (model, optimizer, scheduler) in a new
    ``directory``."""
    model, optimizer, scheduler = objects
    directory.mkdir()
    save_training_state(
        str(directory),
        model=model,
        spec=SPEC,
        optimizer=optimizer,
        scheduler=scheduler,
        epoch=epoch,
        hyperparameters={},
        scaler=scaler,
    )
    return str(directory)


def _restore(
    directory: str,
    objects: tuple[torch.nn.Module, torch.optim.Optimizer, Any],
    scaler: torch.amp.GradScaler,
) -> int:
    model, optimizer, scheduler = objects
    return restore_training_state(
        directory, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
    )


def test_restore_brings_back_weights_optimizer_schedule_and_loss_scale(tmp_path: Path) -> None:
    """A resumed fp16 run keeps its loss scale (a CPU scaler stands in for the GPU's)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    model, optimizer, scheduler = _training_objects()
    scaler.scale(model(torch.rand(2, 3, 32, 32)).sum()).backward()
    scaler.step(optimizer)
    scheduler.step()
    scaler.update(2.0**7)  # the scale an fp16 run found
    saved = _save(tmp_path / "run", (model, optimizer, scheduler), scaler, epoch=4)
    fresh_scaler = torch.amp.GradScaler("cpu")
    fresh, fresh_optimizer, fresh_scheduler = _training_objects()
    next_epoch = _restore(saved, (fresh, fresh_optimizer, fresh_scheduler), fresh_scaler)
    assert next_epoch == 5
    assert fresh_scaler.get_scale() == 2.0**7
    assert fresh_scheduler.get_last_lr() == [0.05]
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_restore_skips_the_loss_scale_where_a_run_has_none(tmp_path: Path) -> None:
    """bf16 or CPU on either side: no scale saved, or none to restore; neither fails."""
    objects = _training_objects()
    off = _save(tmp_path / "off", objects, torch.amp.GradScaler("cuda", enabled=False))
    assert load_training_state(off)["scaler"] == {}
    enabled = torch.amp.GradScaler("cpu", init_scale=8.0)
    assert _restore(off, objects, enabled) == 1
    assert enabled.get_scale() == 8.0  # kept its own start

    on = _save(tmp_path / "on", objects, torch.amp.GradScaler("cpu", init_scale=4.0))
    disabled = torch.amp.GradScaler("cuda", enabled=False)
    assert _restore(on, objects, disabled) == 1
    assert not disabled.is_enabled()


def test_model_checkpoint_refuses_pickled_code(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("code ran",))

    (tmp_path / CHECKPOINT_FILE).write_bytes(pickle.dumps({"epoch": 1, "x": Payload()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_training_state(str(tmp_path))
