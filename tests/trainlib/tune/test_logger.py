"""Each trial's results land in its directory as Ray's loggers write them (``result.json``,
``params.json``, ``progress.csv``, TensorBoard events), and ``Result.from_path`` reads the
history back, whatever restarts rewound it."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib import Result
from trainlib.tune import Trial
from trainlib.tune.logger import (
    CSVLoggerCallback,
    JsonLoggerCallback,
    LoggerCallback,
    TBXLoggerCallback,
    with_default_loggers,
)
from trainlib.tune.search_events import SearchEvents


def _run_trial(
    directory: Path, loggers: list[Any], results: list[dict[str, Any]], config: dict[str, Any]
) -> Trial:
    events = SearchEvents(loggers, LocalFileSystem(), str(directory))
    trial = events.trial(0, "trial_00000", config)
    events.started(trial)
    for result in results:
        events.result(trial.name, result, None)
    trial.state = "complete"
    events.ended(trial)
    return trial


def test_json_logger_writes_params_and_every_result_and_from_path_reads_them(
    tmp_path: Path,
) -> None:
    config = {"lr": 0.1, "layers": [2, 3], "scale": np.float32(0.5)}
    results = [
        {"loss": 1.0 / i, "nested": {"a": i}, "training_iteration": i, "np": np.int64(i)}
        for i in range(1, 4)
    ]
    trial = _run_trial(tmp_path, [JsonLoggerCallback()], results, config)
    lines = Path(trial.path, "result.json").read_text().splitlines()
    assert [json.loads(line)["training_iteration"] for line in lines] == [1, 2, 3]
    assert json.loads(lines[0])["config"] == {"lr": 0.1, "layers": [2, 3], "scale": 0.5}
    assert json.loads(Path(trial.path, "params.json").read_text())["lr"] == 0.1

    read = Result.from_path(trial.path)
    assert read.config == {"lr": 0.1, "layers": [2, 3], "scale": 0.5}
    assert [row["training_iteration"] for row in read.metrics_history] == [1, 2, 3]
    assert read.metrics["loss"] == pytest.approx(1 / 3)
    assert "config" not in read.metrics
    frame = read.metrics_dataframe
    assert list(frame["training_iteration"]) == [1, 2, 3] and list(frame["np"]) == [1, 2, 3]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=12))
def test_history_read_back_keeps_the_last_result_of_each_iteration(
    tmp_path_factory: pytest.TempPathFactory, iterations: list[int]
) -> None:
    """A trial restarted from a checkpoint reports its later iterations again: the history
    read back has each iteration once, as last reported, in order."""
    directory = tmp_path_factory.mktemp("search")
    results = [{"training_iteration": it, "written": n} for n, it in enumerate(iterations)]
    trial = _run_trial(directory, [JsonLoggerCallback()], results, {})
    history = Result.from_path(trial.path).metrics_history
    last = {it: n for n, it in enumerate(iterations)}
    assert [(row["training_iteration"], row["written"]) for row in history] == sorted(last.items())


def test_a_line_cut_short_by_a_crash_is_left_out(tmp_path: Path) -> None:
    trial = _run_trial(tmp_path, [JsonLoggerCallback()], [{"training_iteration": 1}], {})
    with open(Path(trial.path, "result.json"), "a") as cut:
        cut.write('{"training_iteration": 2, "lo')
    assert [r["training_iteration"] for r in Result.from_path(trial.path).metrics_history] == [1]


def test_csv_logger_writes_the_first_results_columns_flattened(tmp_path: Path) -> None:
    results = [
        {"loss": 0.5, "nested": {"a": 1, "b": {"c": 2}}, "training_iteration": 1},
        {"loss": 0.25, "nested": {"a": 3, "b": {"c": 4}}, "training_iteration": 2, "new": 9},
    ]
    trial = _run_trial(tmp_path, [CSVLoggerCallback()], results, {"lr": 1})
    with open(Path(trial.path, "progress.csv")) as progress:
        rows = list(csv.DictReader(progress))
    assert list(rows[0]) == ["loss", "nested/a", "nested/b/c", "training_iteration"]
    assert [(r["loss"], r["nested/b/c"]) for r in rows] == [("0.5", "2"), ("0.25", "4")]

    # the trial goes on (a resumed search): the file goes on, its header once
    _run_trial(tmp_path, [CSVLoggerCallback()], results[:1], {"lr": 1})
    text = Path(trial.path, "progress.csv").read_text()
    assert text.count("training_iteration") == 1 and len(text.splitlines()) == 4


def _tensorboard_scalars(directory: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``directory`` (TFRecord framing: length, its CRC,
    the event, its CRC)."""
    from tensorboardX.proto import event_pb2

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(directory).glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_tbx_logger_writes_each_numeric_metric_at_its_iteration(tmp_path: Path) -> None:
    results = [
        {
            "loss": 1.0,
            "name": "text",
            "flag": True,
            "nested": {"acc": 0.5},
            "training_iteration": 1,
        },
        {
            "loss": 0.5,
            "name": "text",
            "flag": True,
            "nested": {"acc": 0.75},
            "training_iteration": 2,
        },
    ]
    trial = _run_trial(tmp_path, [TBXLoggerCallback()], results, {"lr": 0.1})
    scalars = _tensorboard_scalars(trial.path)
    assert scalars["ray/tune/loss"] == [(1, 1.0), (2, 0.5)]
    assert scalars["ray/tune/nested/acc"] == [(1, 0.5), (2, 0.75)]
    assert not {"ray/tune/name", "ray/tune/flag"} & set(scalars)
    assert len(list(Path(trial.path).glob("events.out.tfevents.*"))) == 1  # hparams in it too


class RaysCustomLogger(LoggerCallback):
    """Ray's "How to Build Custom Tune Loggers?" (tune-output.rst), as written there."""

    def __init__(self, filename: str = "log.txt") -> None:
        self._trial_files: dict[Any, Any] = {}
        self._filename = filename

    def log_trial_start(self, trial: Any) -> None:
        trial_logfile = Path(trial.logdir, self._filename)
        self._trial_files[trial] = open(trial_logfile, "a")  # noqa: SIM115

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        if trial in self._trial_files:
            self._trial_files[trial].write(json.dumps(result))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if trial in self._trial_files:
            self._trial_files[trial].close()
            del self._trial_files[trial]


def test_a_custom_logger_overriding_rays_hooks_sees_its_trials(tmp_path: Path) -> None:
    logger = RaysCustomLogger("log_test.txt")
    trial = _run_trial(tmp_path, [logger], [{"loss": 1.0}, {"loss": 0.5}], {})
    text = Path(trial.logdir, "log_test.txt").read_text()
    assert text.count('"loss"') == 2 and logger._trial_files == {}


def test_default_loggers_are_added_once_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own_json = JsonLoggerCallback()
    kinds = [type(c) for c in with_default_loggers([own_json])]
    assert kinds == [JsonLoggerCallback, CSVLoggerCallback, TBXLoggerCallback]
    assert with_default_loggers([own_json])[0] is own_json
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    assert with_default_loggers([own_json]) == [own_json]
