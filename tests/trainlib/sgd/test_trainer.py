"""PyTorchTrainer's argument checks: each fails before anything starts, naming the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch.nn as nn

from tests.trainlib.sgd.seed_code import data_creator, model_creator, optimizer_creator
from trainlib.errors import ConfigError
from trainlib.sgd import PyTorchTrainer


def _trainer(**kwargs: Any) -> PyTorchTrainer:
    return PyTorchTrainer(
        model_creator, data_creator, optimizer_creator, loss_creator=nn.MSELoss, **kwargs
    )


def test_trainer_rejects_a_batch_size_the_ranks_cannot_share() -> None:
    with pytest.raises(ConfigError, match="must be a multiple of num_replicas=3"):
        _trainer(num_replicas=3, batch_size=16)


def test_trainer_rejects_zero_replicas() -> None:
    with pytest.raises(ConfigError, match="num_replicas=0"):
        _trainer(num_replicas=0)


def test_trainer_rejects_an_unknown_scheduler_step_freq() -> None:
    with pytest.raises(ConfigError, match="'batch' or 'epoch'"):
        _trainer(scheduler_step_freq="manual")


def test_trainer_rejects_the_older_train_function_signature() -> None:
    def custom_train(models: Any, dataloader: Any, criterion: Any, optimizers: Any) -> Any:
        return {}

    with pytest.raises(ConfigError, match=r"\(config, models, train_iterator, criterion"):
        _trainer(train_function=custom_train)


def test_trainer_rejects_a_hook_with_two_arguments() -> None:
    def hook(a: Any, b: Any) -> None:
        pass

    with pytest.raises(ConfigError, match="none or one"):
        _trainer(initialization_hook=hook)


def test_trainer_rejects_a_creator_that_is_not_a_function() -> None:
    with pytest.raises(ConfigError, match="model_creator must be a function"):
        PyTorchTrainer(nn.Linear(1, 1), data_creator, optimizer_creator)
