"""Settings Ray users pass that mean nothing on Dask: accepted, never a TypeError, said once per
setting and process with what trainlib does instead; Ray's defaults say nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # starts processes (tests/process_guard.py)

SCRIPT = """
import warnings
warnings.simplefilter("always")
import trainlib
from trainlib import tune
tune.TuneConfig(reuse_actors=False)  # Ray's default meaning: nothing to say
trainlib.RunConfig(verbose=None, log_to_file=False)
for _ in range(2):  # said once, however often
    trainlib.RunConfig(
        verbose=1,
        log_to_file=True,
        sync_config=tune.SyncConfig(sync_period=60),
        progress_reporter=tune.CLIReporter(metric_columns=["loss"]),
    )
    trainlib.ScalingConfig(num_workers=2, trainer_resources={"CPU": 0}, placement_strategy="SPREAD")
    tune.TuneConfig(reuse_actors=True)
reporter = tune.JupyterNotebookReporter()
reporter.add_metric_column("accuracy", "acc")
print("ok", reporter.added)
"""


def test_ray_settings_are_accepted_and_said_once_each() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok {'metric': ['acc']}"
    said = [line for line in done.stderr.splitlines() if "RayHintIgnored" in line]
    named = sorted(line.split("RayHintIgnored: ", 1)[1].split("=", 1)[0] for line in said)
    assert named == [
        "RunConfig(log_to_file",
        "RunConfig(progress_reporter",
        "RunConfig(sync_config",
        "RunConfig(verbose",
        "ScalingConfig(placement_strategy",
        "ScalingConfig(trainer_resources",
        "TuneConfig(reuse_actors",
    ]
    assert all("<string>:" in line for line in said), said  # at the user's line
    sync = next(line for line in said if "sync_config" in line)
    assert "nothing is synced" in sync and "SyncConfig(...)" in sync
