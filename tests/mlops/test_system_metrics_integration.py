"""System metrics where the ranks run: each host of the group is sampled through Dask and logged
on the training run as ``system/<host>/...``, steps continuing when the run is resumed."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
from distributed import Client
from mlflow.tracking import MlflowClient

import trainlib
from mlops.system_metrics import HostMetricsCallback
from mlops.tracking import start_run
from trainlib.torch import TorchTrainer

BUSY_S = 1.5


def busy_ranks(config: dict[str, float]) -> None:
    """Keeps each rank's core busy for ``seconds``, then reports once."""
    deadline = time.monotonic() + config["seconds"]
    while time.monotonic() < deadline:
        sum(i * i for i in range(10_000))
    trainlib.report({"done": 1})


def fit(client: Client, tracking_uri: str, run_id: str, storage: Path, name: str) -> None:
    TorchTrainer(
        busy_ranks,
        train_loop_config={"seconds": BUSY_S},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(
            name=name,
            storage_path=str(storage),
            callbacks=[HostMetricsCallback(tracking_uri, run_id, interval_s=0.25)],
        ),
        client=client,
    ).fit()


def test_ranks_hosts_are_sampled_on_the_run_and_a_resumed_run_continues(
    dask_client: Client, tmp_path: Path
) -> None:
    tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = start_run(tracking_uri, "host-metrics", "run", {}, {})
    mlflow = MlflowClient(tracking_uri)
    hosts = {info["host"] for info in dask_client.scheduler_info()["workers"].values()}
    assert hosts == {"127.0.0.1"}  # the LocalCluster's two workers: one host, sampled once

    fit(dask_client, tracking_uri, run_id, tmp_path, "first")
    cpu_key = "system/127.0.0.1/cpu_utilization_percentage"
    first = mlflow.get_metric_history(run_id, cpu_key)
    steps = [m.step for m in first]
    assert steps == list(range(len(steps))) and len(steps) >= 3, steps  # one host, a step each
    assert all(0.0 <= m.value <= 100.0 for m in first), first
    assert max(m.value for m in first) >= 50.0, first  # two busy ranks on this host's 2 cores
    metrics = mlflow.get_run(run_id).data.metrics
    assert (
        0.0
        < metrics["system/127.0.0.1/system_memory_usage_megabytes"]
        <= (psutil.virtual_memory().total / 1e6)
    )
    assert "system/127.0.0.1/disk_usage_megabytes" in metrics
    assert "system/127.0.0.1/network_receive_megabytes" in metrics

    fit(dask_client, tracking_uri, run_id, tmp_path, "second")  # the same MLflow run again
    after = [m.step for m in mlflow.get_metric_history(run_id, cpu_key)]
    assert after[: len(steps)] == steps
    assert after[len(steps) :] == list(range(len(steps), len(after))), after
    assert len(after) > len(steps)
