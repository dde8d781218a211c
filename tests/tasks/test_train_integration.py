"""The training step's driver function, as the flow calls it, on a real LocalCluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from cifar.format import write_synthetic_archive
from cifar.train_loop import TrainConfig
from tasks.download import Archive
from tasks.layout import StorageLayout
from tasks.preprocess import preprocess_archive
from tasks.train import TrainRequest, train
from trainlib import DaskConfig

HEAVY = ("prefect", "mlflow", "torchvision")


def test_train_ranks_import_what_training_needs_only(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank imports torch, trainlib and the model code: no Prefect, no MLflow, and no
    torchvision for a model that does not need it (``-X importtime`` lists every import)."""
    archive_path = str(tmp_path / "cifar-10-python.tar.gz")
    md5 = write_synthetic_archive(archive_path, images_per_batch=100)
    layout = StorageLayout.at(str(tmp_path / "store"))
    dask_config = DaskConfig()
    dataset = preprocess_archive(
        Archive(archive_path, md5, verified=True),
        layout,
        dask_config=dask_config,
        num_workers=2,
        batch_size=64,
        rows_per_file=250,
    )
    tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"
    capfd.readouterr()
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # inherited by the ranks started now
    trained = train(
        TrainRequest(
            config=TrainConfig(model="small_cnn", epochs=1, batch_size=64),
            dataset=dataset,
            layout=layout,
            run_name="imports",
            num_workers=2,
            tracking_uri=tracking_uri,
            dask_config=dask_config,
        )
    )
    monkeypatch.delenv("PYTHONPROFILEIMPORTTIME")
    imported = {
        match.group(1)
        for match in re.finditer(r"^import time:.*\|\s+(\S+)$", capfd.readouterr().err, re.M)
    }
    assert {"torch", "trainlib", "cifar.train_loop", "cifar.models"} <= imported
    assert sorted(m for m in imported if m.split(".")[0] in HEAVY) == []
    run = MlflowClient(tracking_uri).get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    # what the GPU settings did, measured on the model: nothing, on a CPU rank without compile
    took_effect = ("channels_last", "autocast_bf16", "autocast_fp16", "compiled_graphs")
    assert {key: trained.final_metrics[key] for key in took_effect} == dict.fromkeys(took_effect, 0)
    assert set(took_effect) <= set(run.data.metrics)
