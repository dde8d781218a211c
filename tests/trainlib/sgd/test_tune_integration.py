"""PyTorchTrainable in a search, as in the RaySGD guide's Tune example: ``tune.run`` with the
trainer's arguments as the config; each trial a 2-rank run on the session's LocalCluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from distributed import Client

from tests.helpers import rank_processes
from tests.trainlib.sgd.seed_code import data_creator, model_creator, optimizer_creator
from trainlib import tune
from trainlib.errors import ConfigError
from trainlib.sgd import PyTorchTrainable


def test_pytorch_trainable_trials_train_validate_and_checkpoint_each_step(
    dask_client: Client, tmp_path: Path
) -> None:
    before = {p.pid for p in rank_processes()}
    grid = tune.run(
        PyTorchTrainable,
        config={
            "model_creator": model_creator,
            "data_creator": data_creator,
            "optimizer_creator": optimizer_creator,
            "loss_creator": nn.MSELoss,
            "num_replicas": 2,
            "batch_size": 8,
            "config": {"lr": tune.grid_search([1e-4, 0.1])},
        },
        stop={"training_iteration": 2},
        metric="validation_loss",
        mode="min",
        scheduler=tune.FIFOScheduler(),
        storage_path=str(tmp_path),
        client=dask_client,
    )
    assert grid.errors == []
    assert sorted(r.config["config"]["lr"] for r in grid) == [1e-4, 0.1]
    for result in grid:  # each step: a training pass, then a validation pass
        assert [m["epoch"] for m in result.metrics_history] == [1, 2]
        assert {"train_loss", "validation_loss"} <= set(result.metrics)
    best = grid.get_best_result()
    assert best.config["config"]["lr"] == 0.1
    assert best.metrics["validation_loss"] < min(
        r.metrics["validation_loss"] for r in grid if r is not best
    )
    assert best.checkpoint is not None
    with best.checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
    assert state["epoch"] == 2
    assert not {p.pid for p in rank_processes()} - before


def test_pytorch_trainable_refuses_a_searched_number_of_replicas() -> None:
    with pytest.raises(ConfigError, match="cannot tune 'num_replicas'"):
        tune.Tuner(
            PyTorchTrainable,
            param_space={"model_creator": model_creator, "num_replicas": tune.choice([1, 2])},
            tune_config=tune.TuneConfig(metric="validation_loss", mode="min"),
        )


def test_tune_run_refuses_a_stop_that_is_not_a_condition() -> None:
    with pytest.raises(ConfigError, match="must be a dict of results to reach"):
        tune.run(lambda config: None, stop=10, metric="a", mode="max")


def test_pytorch_trainable_names_an_argument_it_does_not_take() -> None:
    with pytest.raises(ConfigError, match=r"has \['backend'\]"):
        tune.Tuner(
            PyTorchTrainable,
            param_space={"model_creator": model_creator, "backend": "gloo"},
            tune_config=tune.TuneConfig(metric="validation_loss", mode="min"),
        )
