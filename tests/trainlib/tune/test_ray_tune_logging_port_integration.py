"""Ray Tune's callbacks and loggers by import swap: the example of ``ray.tune.Callback``'s
docstring (python/ray/tune/callback.py) and the custom logger of "Logging and Outputs in Tune"
(doc/source/tune/tutorials/tune-output.rst), Ray's text with the imports changed; then the
search restored from its directory, every trial's history read back (Ray's default loggers'
``result.json``, ``progress.csv``, ``params.json`` and TensorBoard files in each trial's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import trainlib_processes
from tests.trainlib.tune.test_ray_tune_port_integration import swap_module_imports

# ray.tune.Callback's docstring, as written there.
RAY_CALLBACK_EXAMPLE = """
from ray import train, tune
from ray.tune import Callback


class MyCallback(Callback):
    def on_trial_result(self, iteration, trials, trial, result,
                        **info):
        print(f"Got result: {result['metric']}")


def train_func(config):
    for i in range(10):
        tune.report(metric=i)

tuner = tune.Tuner(
    train_func,
    run_config=train.RunConfig(
        callbacks=[MyCallback()]
    )
)
tuner.fit()
"""

# tune-output.rst, "How to Build Custom Tune Loggers?", as written there but for its typo
# (``"log.txt)``, a string never closed) and ``MyTrainableClass``, which the page leaves
# undefined: the trainable of the example above.
RAY_CUSTOM_LOGGER = """
from typing import Dict, List

import json
import os

from ray.tune.logger import LoggerCallback


class CustomLoggerCallback(LoggerCallback):
    \"\"\"Custom logger interface\"\"\"

    def __init__(self, filename: str = "log.txt"):
        self._trial_files = {}
        self._filename = filename

    def log_trial_start(self, trial: "Trial"):
        trial_logfile = os.path.join(trial.logdir, self._filename)
        self._trial_files[trial] = open(trial_logfile, "at")

    def log_trial_result(self, iteration: int, trial: "Trial", result: Dict):
        if trial in self._trial_files:
            self._trial_files[trial].write(json.dumps(result))

    def on_trial_complete(self, iteration: int, trials: List["Trial"],
                          trial: "Trial", **info):
        if trial in self._trial_files:
            self._trial_files[trial].close()
            del self._trial_files[trial]

MyTrainableClass = train_func

from ray import tune

tuner = tune.Tuner(
    MyTrainableClass,
    run_config=air.RunConfig(name="experiment_name", callbacks=[CustomLoggerCallback("log_test.txt")])
)
results = tuner.fit()
"""

RESTORE_AND_PRINT = """
import json
restored = tune.Tuner.restore(os.path.expanduser("~/trainlib_results/experiment_name"), train_func)
grid = restored.get_results()
print("RESULT", json.dumps({
    "trial": grid[0].path,
    "history": grid[0].metrics_dataframe[["metric", "training_iteration"]].values.tolist(),
    "frame": grid.get_dataframe()[["metric", "training_iteration"]].values.tolist(),
}))
"""


def test_rays_callback_and_custom_logger_run_and_a_restored_search_has_every_history(
    tmp_path: Path,
) -> None:
    before = {p.pid for p in trainlib_processes()}
    source = swap_module_imports(RAY_CALLBACK_EXAMPLE + RAY_CUSTOM_LOGGER)
    script = tmp_path / "ported.py"
    script.write_text("from trainlib import air\n" + source + RESTORE_AND_PRINT)  # Ray's air
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path)},  # the default storage path's home
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = [line for line in done.stdout.splitlines() if line.startswith("Got result: ")]
    assert got == [f"Got result: {i}" for i in range(10)]  # the first search's, in order
    result = json.loads(done.stdout.split("RESULT ", 1)[1])

    trial = Path(result["trial"])
    logged = (trial / "log_test.txt").read_text()
    assert logged.count('"metric"') == 10 and '"training_iteration": 10' in logged
    files = {p.name for p in trial.iterdir()}
    assert {"result.json", "progress.csv", "params.json"} <= files
    assert any(name.startswith("events.out.tfevents.") for name in files)
    expected = [[i, i + 1] for i in range(10)]
    assert result["history"] == expected  # read back from the trial's result.json
    assert result["frame"] == [[9, 10]]
    assert {p.pid for p in trainlib_processes()} <= before
