"""A driver process dies right after a checkpoint's commit marker, before its MLflow call; run
again, it logs every epoch exactly once. (Every other instant, down to an MLflow call cut off
part-way, is covered without processes in test_tracking.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mlflow.tracking import MlflowClient

from mlops.tracking import TRAINING_RUN_TAG
from tests.helpers import rank_processes

EPOCHS = 4

DRIVER = """
import os, sys, tempfile
import torch
import trainlib
from mlops.tracking import MLflowCallback, start_run
from trainlib.torch import TorchTrainer

TRACKING_URI, STORAGE, DIE, EPOCHS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


class DieAt(trainlib.Callback):
    # Kills the driver at a report: listed before the MLflow callback, the commit marker is
    # written and MLflow has not been told.
    def __init__(self, index):
        self.index = index

    def on_report(self, report):
        if report.index == self.index:
            os._exit(9)


def train_func(config):
    start = 0
    if (checkpoint := trainlib.get_checkpoint()) is not None:
        with checkpoint.as_directory() as directory:
            start = torch.load(os.path.join(directory, "e.pt"), weights_only=True) + 1
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as directory:
            torch.save(epoch, os.path.join(directory, "e.pt"))
            trainlib.report({"epoch": epoch, "loss": 1.0 / (epoch + 1), "accuracy": 0.1 * epoch},
                            checkpoint=trainlib.Checkpoint.from_directory(directory))


run_id = start_run(TRACKING_URI, "race", "run", {}, {})
mlflow = MLflowCallback(TRACKING_URI, run_id)
callbacks = [DieAt(int(DIE)), mlflow] if DIE else [mlflow]
TorchTrainer(
    train_func,
    train_loop_config={"epochs": EPOCHS},
    scaling_config=trainlib.ScalingConfig(num_workers=2),
    run_config=trainlib.RunConfig(name="run", storage_path=STORAGE,
                                  callbacks=callbacks),
).fit()
"""


def test_tracking_driver_killed_before_the_mlflow_call_logs_each_epoch_once(
    tmp_path: Path,
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    repo = Path(__file__).resolve().parents[2]
    codes = []
    for die in ("1", ""):
        done = subprocess.run(
            [sys.executable, str(script), uri, str(tmp_path / "runs"), die, str(EPOCHS)],
            cwd=repo,
            capture_output=True,
            timeout=180,
            check=False,
        )
        codes.append(done.returncode)
        assert not rank_processes()
    assert codes == [9, 0], done.stderr.decode()[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert [r.data.tags[TRAINING_RUN_TAG] for r in runs] == ["run"]
    for key in ("loss", "accuracy"):
        steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, key)]
        assert sorted(steps) == list(range(EPOCHS)), key
