"""An MLflow server stopped in the middle of a training: the training goes on at its pace, and
every epoch's metrics reach the run once MLflow answers again, in order, each once."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

import trainlib
from mlops.tracking import MLflowCallback, start_run
from tests.mlflow_rig import MlflowServer
from trainlib.torch import TorchTrainer

EPOCHS = 12
EPOCH_S = 0.5
DOWN_AT, DOWN_S = 2, 8.0  # stopped after this report, for this long


def train_func(config: dict[str, Any]) -> None:
    for epoch in range(config["epochs"]):
        time.sleep(config["epoch_s"])
        trainlib.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)})


class Outage(trainlib.Callback):
    """Stops the server after report ``DOWN_AT`` and starts it again ``DOWN_S`` later; keeps
    when each report reached the driver."""

    def __init__(self, server: MlflowServer) -> None:
        self.server = server
        self.times: list[float] = []
        self.restarted: threading.Thread | None = None

    def on_report(self, report: trainlib.Report) -> None:
        self.times.append(time.monotonic())
        if report.index == DOWN_AT:  # (stopping it here would hold this report, not MLflow)
            self.restarted = threading.Thread(target=self._outage)
            self.restarted.start()

    def _outage(self) -> None:
        self.server.stop()
        time.sleep(DOWN_S)
        self.server.start()


def test_tracking_an_mlflow_outage_neither_stops_nor_holds_training(tmp_path: Path) -> None:
    server = MlflowServer(tmp_path)
    server.start()
    try:
        run_id = start_run(server.url, "outage", "run", {}, {})
        outage = Outage(server)
        TorchTrainer(
            train_func,
            train_loop_config={"epochs": EPOCHS, "epoch_s": EPOCH_S},
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(
                name="run",
                storage_path=str(tmp_path / "runs"),
                callbacks=[outage, MLflowCallback(server.url, run_id)],
            ),
        ).fit()
        assert outage.restarted is not None
        outage.restarted.join()
        # Training went on at its pace while MLflow was down: no report waited for it.
        # (Each MLflow call waits through the outage: about 14 s here, had the driver made it.)
        gaps = [later - earlier for earlier, later in itertools.pairwise(outage.times)]
        assert max(gaps) < EPOCH_S + 2.0, gaps
        client = MlflowClient(server.url)
        history = client.get_metric_history(run_id, "loss")
        assert sorted(m.step for m in history) == list(range(EPOCHS))  # each once
        assert client.get_run(run_id).info.status == "FINISHED"
    finally:
        server.stop()
