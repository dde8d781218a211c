"""Trainables of the Tuner tests, in a module of their own: each trial's ranks import it, so
it imports nothing heavy (no pytest, no Dask)."""

from __future__ import annotations

import builtins
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import trainlib
from trainlib import tune


def wait_for_path(path: Path, timeout_s: float = 60.0) -> None:
    """Block until ``path`` exists (the driver writes it), or raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.05)


def _log(config: dict[str, Any], event: str, **fields: Any) -> None:
    """Append one event of this trial to the test's log (one JSON line per event)."""
    line = {"x": config["x"], "event": event, "time": time.time(), "pid": os.getpid(), **fields}
    with open(Path(config["out"]) / "events.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


PARTNER_WAIT_S = 60.0


def _take_start_number(out: Path) -> int:
    """This trial's place in the order trials started: the first free ``started-N`` marker,
    claimed atomically (``open(..., "x")``), so concurrent trials never share a number."""
    number = 0
    while True:
        try:
            open(out / f"started-{number}", "x").close()
            return number
        except FileExistsError:
            number += 1


def record_and_meet_a_partner(config: dict[str, Any]) -> None:
    """Records its interval, its pid and what an earlier trial left in this process.

    Trials pair up in the order they start (0 with 1, 2 with 3, ...): each waits until its
    partner has started, so a pair's intervals overlap by construction. Trials run one at a
    time never meet: the first of a pair then fails after ``PARTNER_WAIT_S``.
    """
    left_over = getattr(builtins, "_trainlib_tune_marker", None)
    builtins._trainlib_tune_marker = config["x"]  # type: ignore[attr-defined]
    out = Path(config["out"])
    started = time.time()  # before the marker: a partner that sees it has seen this start
    number = _take_start_number(out)
    _log(config, "start", left=left_over, number=number, time=started)
    try:
        wait_for_path(out / f"started-{number ^ 1}", PARTNER_WAIT_S)
    except TimeoutError as exc:
        raise TimeoutError(
            f"trial x={config['x']} (started #{number}) ran alone: trial #{number ^ 1} did not "
            f"start within {PARTNER_WAIT_S:g} s"
        ) from exc
    trainlib.report({"score": config["x"]})
    _log(config, "end")


def report_until_pruned(config: dict[str, Any]) -> None:
    """Reports ``x`` at every step; x == 0 would run for 100 steps unless stopped."""
    steps = 100 if config["x"] == 0 else 2
    for step in range(steps):
        _log(config, "report", step=step)
        trainlib.report({"score": config["x"]})
        time.sleep(0.1)


def fail_when_told(config: dict[str, Any]) -> None:
    """``bad`` always raises; ``flaky`` raises on its first attempt only."""
    marker = Path(config["out"]) / f"{config['x']}.attempted"
    first_attempt = not marker.exists()
    marker.touch()
    if config["x"] == "bad" or (config["x"] == "flaky" and first_attempt):
        raise ValueError(f"trial {config['x']} broke")
    trainlib.report({"score": 1.0})


def interrupted_once(config: dict[str, Any]) -> None:
    """Two epochs with a checkpoint each; x == 2 presses Ctrl-C in the driver after its
    first epoch unless it resumed from a checkpoint."""
    checkpoint = trainlib.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = json.loads(Path(directory, "state.json").read_text())["epoch"] + 1
    _log(config, "start", epoch=start)
    for epoch in range(start, 2):
        directory = Path(config["out"]) / f"ckpt-{config['x']}-{epoch}"
        directory.mkdir()
        (directory / "state.json").write_text(json.dumps({"epoch": epoch}))
        trainlib.report(
            {"score": config["x"]}, checkpoint=trainlib.Checkpoint.from_directory(str(directory))
        )
        if config["x"] == 2 and checkpoint is None:
            run_dir = Path(
                config["out"], "runs", "resumable", trainlib.get_context().get_experiment_name()
            )
            wait_for_path(run_dir / "checkpoint_000000" / ".trainlib-commit.json")
            os.kill(config["driver_pid"], signal.SIGINT)
            time.sleep(60)  # stopped by the driver long before this ends


def report_tune_context(config: dict[str, Any]) -> None:
    """Reports ``x`` as the score, with what ``tune.get_context()`` says of its trial."""
    from trainlib import tune

    context = tune.get_context()
    trainlib.report(
        {
            "score": config["x"],
            "trial_name": context.get_trial_name(),
            "trial_id": context.get_trial_id(),
            "trial_dir": context.get_trial_dir(),
            "experiment": context.get_experiment_name(),
        }
    )


def write_and_report_nothing(config: dict[str, Any]) -> None:
    """Leaves a file named after its ``x`` and reports nothing (a Ray Train v2 driver function
    reports through its own trainer, not to the Tuner)."""
    (Path(config["out"]) / f"ran-{config['x']}").write_text("")


def report_threads(config: dict[str, Any]) -> None:
    """Reports how many threads torch runs this trial on."""
    import torch

    trainlib.report({"threads": torch.get_num_threads(), "x": config["x"]})


def report_scheduler() -> None:
    """Reports the scheduler of the Dask cluster this rank runs on, and the group's size."""
    trainlib.report(
        {
            "scheduler": os.environ["DASK_SCHEDULER_ADDRESS"],
            "world_size": trainlib.get_context().get_world_size(),
        }
    )


def start_a_train_run(config: dict[str, Any]) -> None:
    """A Ray Train v2 trial function: a 2-rank TorchTrainer reporting to the Tuner."""
    from trainlib import RunConfig, ScalingConfig, tune
    from trainlib.torch import TorchTrainer
    from trainlib.tune.integration.ray_train import TuneReportCallback

    TorchTrainer(
        report_scheduler,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=f"train-{tune.get_context().get_trial_id()}",
            storage_path=config["storage"],
            callbacks=[TuneReportCallback()],
        ),
    ).fit()


def count_and_report(config: dict[str, Any]) -> None:
    """Appends its ``x`` to ``runs.txt`` and reports it as the score."""
    with open(Path(config["out"]) / "runs.txt", "a") as runs:
        runs.write(f"{config['x']}\n")
    trainlib.report({"score": config["x"]})


def fail_while_flagged(config: dict[str, Any]) -> None:
    """Reports its ``x`` (and the trial's name); fails first while ``{out}/fail-{x}`` exists."""
    trainlib.report({"score": config["x"], "trial": tune.get_context().get_trial_name()})
    if (Path(config["out"]) / f"fail-{config['x']}").exists():
        raise RuntimeError(f"trial with x={config['x']} fails while flagged")


class CountingTrainable(tune.Trainable):
    """Counts its steps; dies once at its 4th (``{out}/died`` marks it); saves and loads the
    count; ends itself after 6."""

    def setup(self, config: dict[str, Any]) -> None:
        self.total = 0
        self.out = Path(config["out"])

    def step(self) -> dict[str, Any]:
        if self.iteration == 3 and not (self.out / "died").exists():
            (self.out / "died").touch()
            raise RuntimeError("dies once, at its 4th step")
        self.total += 1
        return {"total": self.total, "done": self.iteration + 1 >= 6}

    def save_checkpoint(self, checkpoint_dir: str) -> str:
        (Path(checkpoint_dir) / "total").write_text(str(self.total))
        return checkpoint_dir

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        self.total = int((Path(str(checkpoint)) / "total").read_text())
        (self.out / "loaded").write_text(f"{self.total} at iteration {self.iteration}")


def _arrive_and_wait_for_the_other(out: Path, step: int, name: str) -> None:
    """A two-trial barrier at ``step``: mark this trial's arrival, wait for the other's. A
    trial that arrives at ``step`` has seen its report of ``step - 1`` processed."""
    here = out / f"step-{step}"
    here.mkdir(exist_ok=True)
    (here / name).touch()
    deadline = time.monotonic() + PARTNER_WAIT_S
    while len(list(here.iterdir())) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError(f"trial {name} waited {PARTNER_WAIT_S:g} s at step {step} alone")
        time.sleep(0.05)


def population_member(config: dict[str, Any]) -> None:
    """A PBT trial: ``score`` is its ``quality``; each step checkpoints the step and the trial
    that made it, and reports where the trial last resumed from. Two trials step in lockstep,
    so each sees the other's previous result when it reports."""
    out = Path(config["out"])
    name = tune.get_context().get_trial_name()
    assert name is not None
    step, resumed = 0, {"step": None, "origin": None}
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resumed = json.loads((Path(directory) / "state.json").read_text())
        step = resumed["step"]
    while step < config["steps"]:
        step += 1
        _arrive_and_wait_for_the_other(out, step, name)
        with tempfile.TemporaryDirectory() as directory:
            state = {"step": step, "origin": name}
            (Path(directory) / "state.json").write_text(json.dumps(state))
            metrics = {
                "score": config["quality"],
                "step": step,
                "resumed_step": resumed["step"],
                "resumed_origin": resumed["origin"],
            }
            trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(directory))
        trainlib.get_all_reported_checkpoints()  # returns once the driver processed the report


CURVES = {"dip": [5.0, 1.0, 4.0], "flat": [3.0, 3.0, 3.0]}


def report_a_curve(config: dict[str, Any]) -> None:
    """Reports the losses of the curve ``config["shape"]`` names, a checkpoint with each."""
    for loss in CURVES[config["shape"]]:
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "loss").write_text(str(loss))
            trainlib.report(
                {"loss": loss}, checkpoint=trainlib.Checkpoint.from_directory(directory)
            )


def report_epochs(config: dict[str, Any]) -> None:
    """Reports ``score = x`` at epochs 2, 4, ... 20 (``epoch`` missing with ``no_epoch``)."""
    for epoch in range(2, 21, 2):
        metrics = (
            {"score": config["x"]}
            if config.get("no_epoch")
            else {"score": config["x"], "epoch": epoch}
        )
        trainlib.report(metrics)
