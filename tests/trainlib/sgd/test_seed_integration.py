"""Seed 002's RaySGD guide, run on trainlib.sgd: live groups of 2 real gloo ranks on the
session's LocalCluster (see ``seed_code`` for the guide's snippets)."""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import torch.nn as nn
from distributed import Client

from tests.helpers import rank_processes
from tests.trainlib.sgd import seed_code
from tests.trainlib.sgd.seed_code import (
    custom_validate,
    data_creator,
    gan_data_creator,
    gan_model_creator,
    gan_optimizer_creator,
    initialization_hook,
    model_creator,
    optimizer_creator,
    scheduler_creator,
    train,
)
from trainlib import RunConfig
from trainlib.sgd import PyTorchTrainable, PyTorchTrainer

num_replicas = 2


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sgd")


@pytest.fixture(scope="module")
def trainer(dask_client: Client, out_dir: Path) -> Iterator[PyTorchTrainer]:
    """The guide's creator example, with its initialization hook, on 2 ranks."""
    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        scheduler_creator=scheduler_creator,
        initialization_hook=initialization_hook,
        config={"lr": 0.1, "out_dir": str(out_dir), "kill_flag": str(out_dir / "kill")},
        num_replicas=num_replicas,
        run_config=RunConfig(storage_path=str(out_dir / "runs")),
        client=dask_client,
    )
    yield trainer
    trainer.shutdown()


def _params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def test_sgd_initialization_hook_runs_in_every_rank_before_the_creators(
    trainer: PyTorchTrainer, out_dir: Path
) -> None:
    marks = sorted(p.name for p in out_dir.glob("data-creator-*"))
    assert len(marks) == num_replicas
    assert all(mark.endswith("-INFO") for mark in marks)
    assert len({mark.split("-")[2] for mark in marks}) == num_replicas  # one per process


def test_sgd_creator_example_trains_and_validates(trainer: PyTorchTrainer) -> None:
    first = trainer.train()
    for _ in range(15):
        last = trainer.train()
    validation = trainer.validate()
    assert first["epoch"] + 15 == last["epoch"]
    assert last["train_loss"] < first["train_loss"]
    assert last["num_samples"] == 64 / num_replicas
    assert validation["validation_loss"] < first["train_loss"]
    model = trainer.get_model()
    assert isinstance(model, nn.Linear)
    # y = 2x + 5 with noise of 0.01: 16 epochs of 4 steps at lr 0.1 (decayed by 0.9 every 5)
    # fit slope and intercept to within 0.01
    assert _params(model) == pytest.approx([2.0, 5.0], abs=0.01)


def test_sgd_save_then_restore_into_a_second_trainer(
    trainer: PyTorchTrainer, dask_client: Client, tmp_path: Path
) -> None:
    checkpoint_path = os.path.join(tmp_path, "checkpoint")
    trainer.save(checkpoint_path)
    before = {p.pid for p in rank_processes()}
    trainer_2 = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        num_replicas=num_replicas,
        use_fp16=True,  # bfloat16 autocast on the CPU
        client=dask_client,
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
    )
    ranks_2 = [p for p in rank_processes() if p.pid not in before]
    trainer_2.restore(checkpoint_path)
    assert _params(trainer_2.get_model()) == _params(trainer.get_model())
    assert trainer_2.validate()["validation_loss"] == pytest.approx(
        trainer.validate()["validation_loss"],
        abs=0.05,  # bfloat16 against float32
    )
    assert trainer_2.train()["train_loss"] < 1.0
    assert len(ranks_2) == num_replicas
    del trainer_2
    gc.collect()  # garbage collection stops the ranks
    assert not [p for p in ranks_2 if psutil.pid_exists(p.pid)]


def test_sgd_train_with_retries_survives_a_rank_sigkill(
    trainer: PyTorchTrainer, out_dir: Path
) -> None:
    epoch = trainer.train()["epoch"]
    before = {p.pid for p in rank_processes()}
    (out_dir / "kill").touch()  # a rank SIGKILLs itself while reading its first batch
    stats = trainer.train(max_retries=1)
    assert not (out_dir / "kill").exists()
    assert stats["epoch"] == epoch + 1  # the new group resumed from the state before the pass
    assert stats["train_loss"] < 1.0
    assert not before & {p.pid for p in rank_processes()}  # a new group


def test_sgd_train_with_retries_loads_the_state_file_given_into_the_new_group(
    trainer: PyTorchTrainer, out_dir: Path, tmp_path: Path
) -> None:
    saved = trainer.save(str(tmp_path / "state.pt"))
    epoch = trainer.train()["epoch"]  # the file holds the epoch before this one
    trainer.save(str(tmp_path / "later.pt"))  # the run's latest checkpoint: after that pass
    (out_dir / "kill").touch()
    stats = trainer.train(max_retries=1, checkpoint=saved)
    assert not (out_dir / "kill").exists()
    assert stats["epoch"] == epoch  # the pass ran again from the file's state


def test_sgd_shutdown_stops_every_rank(dask_client: Client, tmp_path: Path) -> None:
    before = {p.pid for p in rank_processes()}
    trainable = PyTorchTrainable(
        {
            "model_creator": model_creator,
            "data_creator": data_creator,
            "optimizer_creator": optimizer_creator,
            "loss_creator": nn.MSELoss,
            "num_replicas": num_replicas,
            "client": dask_client,
            "run_config": RunConfig(storage_path=str(tmp_path / "runs")),
        }
    )
    mine = {p.pid for p in rank_processes()} - before
    stats = trainable.step()
    assert {"train_loss", "validation_loss", "epoch"} <= set(stats)
    path = trainable.save_checkpoint(str(tmp_path))
    trainable.load_checkpoint(path)
    assert trainable.step()["epoch"] == 2
    trainable.cleanup()
    assert len(mine) == num_replicas
    assert not mine & {p.pid for p in rank_processes()}
    with pytest.raises(RuntimeError, match="shut down; create a new one"):
        trainable.step()


def test_sgd_gan_multi_model_with_custom_functions(dask_client: Client, tmp_path: Path) -> None:
    trainer = PyTorchTrainer(
        gan_model_creator,
        gan_data_creator,
        gan_optimizer_creator,
        nn.BCELoss,
        train_function=train,
        validation_function=custom_validate,
        num_replicas=num_replicas,
        batch_size=8,
        client=dask_client,
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
    )
    try:
        untrained = trainer.get_model()
        before = trainer.validate()
        epochs = [trainer.train() for _ in range(3)]
        after = trainer.validate()
        net_d, net_g = trainer.get_model()  # Returns multiple models
    finally:
        trainer.shutdown()
    stats = epochs[0]
    # The untrained discriminator is at chance (its loss on real and generated images is
    # 2 ln 2); after 3 passes it tells them apart. The run is seeded (weights, images, noise:
    # seed_code), so it has one outcome: validation_loss_d 1.385 -> 1.140, validation_accuracy
    # 1.0 (chance: 0.5), loss_d of the 3rd pass 0.20 below the 1st's. (Unseeded, one run in
    # a fresh-clone CI ended at 1.29, above the bound.)
    assert before["validation_loss_d"] == pytest.approx(2 * math.log(2), abs=0.01)
    assert after["validation_loss_d"] < 2 * math.log(2) - 0.1
    assert after["validation_accuracy"] >= 0.9
    assert epochs[-1]["loss_d"] < epochs[0]["loss_d"] - 0.05
    assert {"loss_g", "loss_d", "inception", "epoch"} <= set(stats)
    assert isinstance(net_d, seed_code.Discriminator)
    assert isinstance(net_g, seed_code.Generator)
    assert _params(net_d) != _params(untrained[0])
    assert _params(net_g) != _params(untrained[1])
