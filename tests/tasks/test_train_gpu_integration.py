"""The CIFAR training loop on GPUs, as the flow runs it: bf16 (or fp16 with its GradScaler),
channels_last, the side-stream prefetch, the cached shard on the device, compile after the DDP
wrap, NCCL between two GPUs. Skipped without CUDA (none of the machines here has one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cifar.dataset import Dataset
from cifar.format import write_synthetic_archive
from cifar.train_loop import TrainConfig
from tasks.download import Archive
from tasks.layout import StorageLayout
from tasks.preprocess import preprocess_archive
from tasks.train import TrainedRun, TrainRequest, train
from trainlib import DaskConfig

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _dataset(tmp_path: Path, dask_config: DaskConfig, num_workers: int) -> Dataset:
    archive_path = str(tmp_path / "cifar-10-python.tar.gz")
    md5 = write_synthetic_archive(archive_path, images_per_batch=500)
    return preprocess_archive(
        Archive(archive_path, md5, verified=True),
        StorageLayout.at(str(tmp_path / "store")),
        dask_config=dask_config,
        num_workers=num_workers,
        batch_size=128,
        rows_per_file=500,
    )


def _train(tmp_path: Path, num_workers: int, **config: object) -> TrainedRun:
    dask_config = DaskConfig()
    return train(
        TrainRequest(
            config=TrainConfig(epochs=3, batch_size=128, lr=0.05, use_gpu=True, **config),  # type: ignore[arg-type]
            dataset=_dataset(tmp_path, dask_config, num_workers),
            layout=StorageLayout.at(str(tmp_path / "store")),
            run_name="gpu",
            num_workers=num_workers,
            tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
            dask_config=dask_config,
        )
    )


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
@pytest.mark.parametrize("compile_model", [False, True], ids=["eager", "compiled"])
def test_gpu_training_learns_the_synthetic_classes(tmp_path: Path, compile_model: bool) -> None:
    trained = _train(tmp_path, num_workers=1, compile=compile_model)
    assert trained.best_metrics["val_accuracy"] > 0.5  # ten classes: chance is 0.1
    assert torch.isfinite(torch.tensor(trained.final_metrics["train_loss"]))
    _assert_the_gpu_settings_took_effect(trained.final_metrics, compile_model)


def _assert_the_gpu_settings_took_effect(metrics: dict[str, float], compiled: bool) -> None:
    """The mechanism, not only the outcome: the weights in channels_last, the forward pass in
    bf16 where the GPU has it (else fp16), and graphs compiled exactly when asked."""
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    assert metrics["channels_last"] == 1
    assert (metrics["autocast_bf16"], metrics["autocast_fp16"]) == ((1, 0) if bf16 else (0, 1))
    assert (metrics["compiled_graphs"] > 0) is compiled


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices (NCCL between them)")
def test_gpu_training_ddp_on_two_gpus_learns_as_one(tmp_path: Path) -> None:
    trained = _train(tmp_path, num_workers=2, compile=True)
    assert trained.best_metrics["val_accuracy"] > 0.5
    _assert_the_gpu_settings_took_effect(trained.final_metrics, compiled=True)
