"""Ray Train's "Get started with PyTorch FSDP2" guide, ported by changing its imports
(``ray.train`` -> ``trainlib``), on a CPU mesh: a tiny ViT on random FashionMNIST-shaped
tensors instead of FashionMNIST, without the guide's memory profiler, CPU offload and fp16
(gloo has no fp16 reduce-scatter). Its sharded DCP checkpoints resume a stopped run, also with
another number of ranks, and its consolidated model lands in ``full_model``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from distributed import Client
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import VisionTransformer

import trainlib
import trainlib.torch
from trainlib import Callback, Report, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer

logger = logging.getLogger(__name__)


def init_model() -> torch.nn.Module:
    model = VisionTransformer(
        image_size=28, patch_size=7, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=16,
        num_classes=10,
    )  # fmt: skip
    model.conv_proj = torch.nn.Conv2d(in_channels=1, out_channels=16, kernel_size=7, stride=7)
    return model


def fake_fashion_mnist() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(64, 1, 28, 28, generator=generator)
    return TensorDataset(images, torch.randint(0, 10, (64,), generator=generator))


def shard_model(model: torch.nn.Module) -> None:
    world_size = trainlib.get_context().get_world_size()
    device_type = trainlib.torch.get_device().type  # the guide: "cuda"
    mesh = init_device_mesh(device_type=device_type, mesh_shape=(world_size,))
    for encoder_block in model.encoder.layers.children():
        fully_shard(encoder_block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)


class AppState(Stateful):
    def __init__(self, model: torch.nn.Module, optimizer: Any = None, epoch: int = 0) -> None:
        self.model = model
        self.optimizer = optimizer
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict, "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if "epoch" in state_dict:
            self.epoch = state_dict["epoch"]


def load_fsdp_checkpoint(model: Any, optimizer: Any, ckpt: trainlib.Checkpoint) -> int:
    with ckpt.as_directory() as checkpoint_dir:
        app_state = AppState(model, optimizer)
        dcp.load(state_dict={"app": app_state}, checkpoint_id=checkpoint_dir)
    return app_state.epoch


def report_metrics_and_save_fsdp_checkpoint(
    model: Any, optimizer: Any, metrics: dict[str, Any], epoch: int = 0
) -> None:
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        state_dict = {"app": AppState(model, optimizer, epoch)}
        dcp.save(state_dict=state_dict, checkpoint_id=temp_checkpoint_dir)
        checkpoint = trainlib.Checkpoint.from_directory(temp_checkpoint_dir)
        trainlib.report(metrics, checkpoint=checkpoint)


def save_model_for_inference(model: Any, world_rank: int) -> None:
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        save_file = os.path.join(temp_checkpoint_dir, "full-model.pt")
        model_state_dict = get_model_state_dict(
            model=model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        checkpoint = None
        if world_rank == 0:
            torch.save(model_state_dict, save_file)
            checkpoint = trainlib.Checkpoint.from_directory(temp_checkpoint_dir)
        trainlib.report({}, checkpoint=checkpoint, checkpoint_dir_name="full_model")


def train_func(config: dict[str, Any]) -> None:
    model = init_model()
    device = trainlib.torch.get_device()
    model.to(device)
    shard_model(model)
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=config.get("learning_rate", 0.001))
    start_epoch = 0
    loaded_checkpoint = trainlib.get_checkpoint()
    if loaded_checkpoint:
        latest_epoch = load_fsdp_checkpoint(model, optimizer, loaded_checkpoint)
        start_epoch = latest_epoch + 1
        logger.info(f"Resuming training from epoch {start_epoch}")
    train_loader = DataLoader(fake_fashion_mnist(), batch_size=config.get("batch_size", 16))
    train_loader = trainlib.torch.prepare_data_loader(train_loader)
    world_rank = trainlib.get_context().get_world_rank()
    running_loss = 0.0
    num_batches = 0
    for epoch in range(start_epoch, config.get("epochs", 5)):
        if trainlib.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for images, labels in train_loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            num_batches += 1
        metrics = {"loss": running_loss / num_batches, "epoch": epoch}
        report_metrics_and_save_fsdp_checkpoint(model, optimizer, metrics, epoch)
    save_model_for_inference(model, world_rank)


class _Stopped(Exception):
    pass


class StopAfterEpoch(Callback):
    """Stops the run once the report of ``epoch`` is committed (as a preemption would)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_report(self, report: Report) -> None:
        if report.metrics.get("epoch") == self.epoch:
            raise _Stopped


def _fit(client: Client, storage: Path, num_workers: int, **run: Any) -> trainlib.Result:
    return TorchTrainer(
        train_func,
        train_loop_config={"epochs": 4},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name="fsdp_mnist", storage_path=str(storage), **run),
        client=client,
    ).fit()


@pytest.fixture(scope="module")
def stopped_run(dask_client: Client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Storage holding a 2-rank run stopped after epochs 0 and 1 (the guide's 2 epochs)."""
    storage = tmp_path_factory.mktemp("stopped")
    with pytest.raises(_Stopped):
        _fit(dask_client, storage, 2, callbacks=[StopAfterEpoch(1)])
    return storage


@pytest.fixture
def storage(stopped_run: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the stopped run's storage for one test."""
    copy = tmp_path / "storage"
    shutil.copytree(stopped_run, copy)
    yield copy


def _resumed_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Resuming")]


def test_fsdp_guide_commits_every_ranks_dcp_shard(stopped_run: Path) -> None:
    result = trainlib.Result.from_path(stopped_run / "fsdp_mnist")
    assert [m["epoch"] for m in result.metrics_history] == [0, 1]
    assert result.checkpoint is not None
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(result.checkpoint.files())
    # the commit marker vouches for every rank's shard, by its contents
    directory = Path(result.checkpoint.path)
    marker = json.loads((directory / ".trainlib-commit.json").read_text())
    assert {name: entry["sha256"] for name, entry in marker["files"].items()} == {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in ("__0_0.distcp", "__1_0.distcp", ".metadata")
    }


def test_fsdp_guide_resumes_at_epoch_2_and_saves_the_full_model(
    dask_client: Client, storage: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger=__name__)
    result = _fit(dask_client, storage, 2)
    assert _resumed_from(caplog) == ["Resuming training from epoch 2"]
    assert [m.get("epoch") for m in result.metrics_history] == [2, 3, None]
    assert result.checkpoint is not None
    assert result.checkpoint.path == str(storage / "fsdp_mnist" / "full_model")
    state = torch.load(Path(result.checkpoint.path, "full-model.pt"), weights_only=True)
    plain = init_model()
    plain.load_state_dict(state)  # a consolidated, unsharded state dict
    # the same weights as epoch 3's checkpoint: both ranks' DCP shards, gathered offline
    epoch_3 = next(c for c, m in result.best_checkpoints if m.get("epoch") == 3)
    gathered = tmp_path / "epoch-3.pt"
    dcp_to_torch_save(epoch_3.path, gathered)
    shards = torch.load(gathered, weights_only=True)["app"]["model"]
    assert sorted(shards) == sorted(state)
    assert [name for name in state if not torch.equal(state[name], shards[name])] == []


def test_fsdp_guide_resumes_on_one_rank_from_two_ranks_shards(
    dask_client: Client, storage: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=__name__)
    result = _fit(dask_client, storage, 1)  # DCP reshards the 2-rank checkpoint
    assert _resumed_from(caplog) == ["Resuming training from epoch 2"]
    assert [m.get("epoch") for m in result.metrics_history] == [2, 3, None]
    epoch_3 = next(c for c, m in result.best_checkpoints if m.get("epoch") == 3)
    assert "__1_0.distcp" not in epoch_3.files() and "__0_0.distcp" in epoch_3.files()


def prepared_fsdp(config: dict[str, Any]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    model = trainlib.torch.prepare_model(
        model, parallel_strategy="fsdp", parallel_strategy_kwargs={"reshard_after_forward": False}
    )
    weight = model[0].weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    trainlib.report(
        {
            "sharded": isinstance(model, FSDPModule),
            "local_rows": weight.to_local().shape[0],  # type: ignore[attr-defined]
            "devices": [str(d) for d in trainlib.torch.get_devices()],
        }
    )


def test_prepare_model_fsdp_shards_the_root_across_the_ranks(
    dask_client: Client, tmp_path: Path
) -> None:
    result = TorchTrainer(
        prepared_fsdp,
        train_loop_config={},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path)),
        client=dask_client,
    ).fit()
    assert result.metrics == {"sharded": True, "local_rows": 16, "devices": ["cpu"]}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
def test_fsdp_guide_trains_on_gpus_with_nccl(tmp_path: Path) -> None:
    result = TorchTrainer(
        train_func,
        train_loop_config={"epochs": 2},
        scaling_config=ScalingConfig(num_workers=torch.cuda.device_count(), use_gpu=True),
        run_config=RunConfig(name="fsdp_gpu", storage_path=str(tmp_path)),
    ).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/full_model")
    assert [m.get("epoch") for m in result.metrics_history] == [0, 1, None]
