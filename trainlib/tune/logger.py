"""Each trial's results in files of its directory, as Ray's ``ray.tune.logger``.

- ``JsonLoggerCallback``: ``params.json`` (the config) and ``result.json`` (each result, a JSON
  object a line, its ``config`` included);
- ``CSVLoggerCallback``: ``progress.csv`` (each result flattened, ``a/b`` for nested keys; the
  columns of the first result);
- ``TBXLoggerCallback``: TensorBoard event files (``tensorboardX``: the ``[tensorboard]``
  extra), each numeric metric under ``ray/tune/``, the config as hyperparameters at the end.

A Tuner adds the three (TensorBoard's where ``tensorboardX`` is installed), as Ray does,
unless ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1`` or ``RunConfig(callbacks=)`` already has one
of that class. ``Result.from_path`` reads a trial's history back from ``result.json``.
Subclass ``LoggerCallback`` for a logger of your own (Ray's ``log_trial_*`` methods).
Ray's ``params.pkl`` is not written: a config that JSON cannot hold is written as text.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from numbers import Number
from pathlib import Path
from typing import IO, Any

from trainlib.result import PARAMS_FILE, RESULT_FILE
from trainlib.tune.callback import Callback, Trial

EXPR_PARAM_FILE = PARAMS_FILE
EXPR_RESULT_FILE = RESULT_FILE
EXPR_PROGRESS_FILE = "progress.csv"
AUTO_LOGGERS_VARIABLE = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"


class LoggerCallback(Callback):
    """Base class of loggers: override the ``log_trial_*`` methods (as Ray's)."""

    def log_trial_start(self, trial: Trial) -> None:
        """A trial started."""

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """A trial reported ``result``."""

    def log_trial_save(self, trial: Trial) -> None:
        """A trial committed a checkpoint."""

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """A trial ended (``failed``: with an error)."""

    def on_trial_start(  # type: ignore[override]
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_start(trial)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        self.log_trial_result(iteration, trial, result)

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_save(trial)

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=False)

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=True)


def _as_text(value: Any) -> Any:
    """What JSON cannot hold: a NumPy or torch scalar as its number, the rest as text."""
    try:
        return value.item()
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return repr(value)


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level, keys joined with ``/`` (as Ray logs results and configs)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


class _FileLogger(LoggerCallback):
    """A file a trial, in its ``local_path``, open while it runs."""

    filename = ""

    def __init__(self) -> None:
        self._files: dict[Trial, IO[str]] = {}

    def _open(self, trial: Trial) -> IO[str]:
        if trial not in self._files:
            self._files[trial] = open(Path(trial.local_path, self.filename), "a")  # noqa: SIM115
        return self._files[trial]

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        handle = self._files.pop(trial, None)
        if handle is not None:
            handle.close()


class JsonLoggerCallback(_FileLogger):
    """``params.json`` and ``result.json`` in each trial's directory (Ray's)."""

    filename = EXPR_RESULT_FILE

    def log_trial_start(self, trial: Trial) -> None:
        with open(Path(trial.local_path, EXPR_PARAM_FILE), "w") as params:
            json.dump(trial.config, params, indent=2, sort_keys=True, default=_as_text)
        self._open(trial)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        handle = self._open(trial)
        handle.write(json.dumps(result, default=_as_text) + "\n")
        handle.flush()


class CSVLoggerCallback(_FileLogger):
    """``progress.csv`` in each trial's directory (Ray's)."""

    filename = EXPR_PROGRESS_FILE

    def __init__(self) -> None:
        super().__init__()
        self._writers: dict[Trial, csv.DictWriter[str]] = {}

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        row = flatten({k: v for k, v in result.items() if k != "config"})
        handle = self._open(trial)
        writer = self._writers.get(trial)
        if writer is None:
            writer = csv.DictWriter(handle, list(row), extrasaction="ignore")
            if handle.tell() == 0:  # a trial resumed goes on with the file it had
                writer.writeheader()
            self._writers[trial] = writer
        writer.writerow(row)
        handle.flush()

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        self._writers.pop(trial, None)
        super().log_trial_end(trial, failed)


class TBXLoggerCallback(LoggerCallback):
    """TensorBoard event files in each trial's directory (Ray's; needs ``tensorboardX``).

    Raises:
        ImportError: ``tensorboardX`` is not installed (``pip install tensorboardX``, or the
            ``[tensorboard]`` extra).
    """

    def __init__(self) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as missing:
            raise ImportError(
                "TBXLoggerCallback needs tensorboardX: pip install tensorboardX (the "
                "[tensorboard] extra)."
            ) from missing
        self._writer_class = SummaryWriter
        self._writers: dict[Trial, Any] = {}

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        writer = self._writers.get(trial)
        if writer is None:
            writer = self._writers[trial] = self._writer_class(trial.local_path, flush_secs=30)
        step = result.get("timesteps_total") or result.get("training_iteration") or iteration
        values = flatten({k: v for k, v in result.items() if k != "config"})
        for key, value in values.items():
            if isinstance(value, Number) and not isinstance(value, bool):
                writer.add_scalar(f"ray/tune/{key}", value, global_step=step)
        writer.flush()

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        writer = self._writers.pop(trial, None)
        if writer is None:
            return
        params = {
            k: v if isinstance(v, (Number, str, bool)) else str(v)
            for k, v in flatten(trial.config).items()
        }
        metrics = {
            f"ray/tune/{k}": v
            for k, v in flatten(trial.last_result).items()
            if k != "config" and not k.startswith("config/")
            if isinstance(v, Number) and not isinstance(v, bool)
        }
        from tensorboardX.summary import hparams

        for summary in hparams(params, metrics):  # into this writer's file, as Ray does
            writer.file_writer.add_summary(summary)
        writer.close()


def with_default_loggers(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` and the loggers Ray adds by default (JSON, CSV, TensorBoard's where
    ``tensorboardX`` is installed) that are not among them, unless
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``."""
    if os.environ.get(AUTO_LOGGERS_VARIABLE, "0") == "1":
        return list(callbacks)
    defaults: list[type[LoggerCallback]] = [JsonLoggerCallback, CSVLoggerCallback]
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        pass
    else:
        defaults.append(TBXLoggerCallback)
    added = [kind() for kind in defaults if not any(isinstance(c, kind) for c in callbacks)]
    return [*callbacks, *added]
