"""``tune.Trainable``: Ray Tune's class API, run as a function trial.

A trial of a ``Trainable`` subclass builds it with its config (``setup``), then calls
``step()`` and reports what it returns, once per training iteration, until the search stops
the trial (a stopper, a scheduler's ``max_t`` or its pruning) or ``step()`` returns
``done=True``. Every ``CheckpointConfig.checkpoint_frequency`` iterations (and at a
``done=True`` end with ``checkpoint_at_end``), ``save_checkpoint(dir)`` writes a checkpoint
reported with that result: a trainlib checkpoint, committed before it counts, from which a
restarted run or a resumed search calls ``load_checkpoint`` and goes on at the next
iteration.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from collections.abc import Mapping
from typing import Any

from trainlib.config import CheckpointConfig
from trainlib.errors import ConfigError

_STATE_FILE = ".tune_trainable.json"  # the iteration a checkpoint was saved at
_RETURNED_FILE = ".tune_checkpoint_dict.pkl"  # what save_checkpoint returned, when a dict


class Trainable:
    """Base class of a class trainable, as Ray's ``tune.Trainable``: override ``setup``,
    ``step`` and, to checkpoint, ``save_checkpoint`` and ``load_checkpoint``."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        from trainlib.tune.context import get_context

        self.config: dict[str, Any] = dict(config or {})
        self._iteration = 0
        context = get_context()
        self.trial_id: str | None = context.get_trial_id()
        self.trial_name: str | None = context.get_trial_name()
        self.setup(dict(self.config))

    @property
    def iteration(self) -> int:
        """Training iterations done (``step()`` calls), counted across restores."""
        return self._iteration

    @property
    def training_iteration(self) -> int:
        """The same as ``iteration``, Ray's other name for it."""
        return self._iteration

    def setup(self, config: dict[str, Any]) -> None:
        """Build what the trial trains (called once, with its config)."""

    def step(self) -> dict[str, Any]:
        """One training iteration; returns its metrics (``done=True`` ends the trial)."""
        raise NotImplementedError(f"{type(self).__name__}.step() must be overridden")

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | str | None:
        """Write the state into ``checkpoint_dir`` (or return it as a dict)."""
        return None

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Restore the state ``save_checkpoint`` saved (its directory, or its dict)."""

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Ray calls it to reuse an actor for a new trial; trainlib never reuses one (every
        trial's rank is a fresh process), so it is never called."""
        return False

    def cleanup(self) -> None:
        """Release what ``setup`` took (called when ``step`` ends the trial)."""


class ClassTrial:
    """The function a trial of ``trainable_class`` runs."""

    def __init__(self, trainable_class: type[Trainable], checkpoints: CheckpointConfig) -> None:
        self.trainable_class = trainable_class
        self.frequency = checkpoints.checkpoint_frequency
        self.at_end = bool(checkpoints.checkpoint_at_end)
        self.__name__ = trainable_class.__name__

    def __call__(self, config: dict[str, Any]) -> None:
        from trainlib.checkpoint import Checkpoint
        from trainlib.reporting import get_checkpoint, report

        trainable = self.trainable_class(config)
        latest = get_checkpoint()
        if latest is not None:
            with latest.as_directory() as directory:
                _load(trainable, directory)
        try:
            while True:
                result = trainable.step()
                if not isinstance(result, Mapping):
                    raise ConfigError(
                        f"{self.__name__}.step() returned {result!r}: it must return a dict of "
                        "metrics."
                    )
                trainable._iteration += 1
                done = bool(result.get("done", False))
                if self._checkpoint_now(trainable.iteration, done):
                    with tempfile.TemporaryDirectory() as directory:
                        _save(trainable, directory)
                        report(dict(result), checkpoint=Checkpoint.from_directory(directory))
                else:
                    report(dict(result))
                if done:
                    return
        finally:
            trainable.cleanup()

    def _checkpoint_now(self, iteration: int, done: bool) -> bool:
        return (self.frequency > 0 and iteration % self.frequency == 0) or (done and self.at_end)


def _save(trainable: Trainable, directory: str) -> None:
    returned = trainable.save_checkpoint(directory)
    if isinstance(returned, Mapping):
        with open(os.path.join(directory, _RETURNED_FILE), "wb") as f:
            pickle.dump(dict(returned), f)
    with open(os.path.join(directory, _STATE_FILE), "w") as f:
        json.dump({"iteration": trainable.iteration}, f)


def _load(trainable: Trainable, directory: str) -> None:
    with open(os.path.join(directory, _STATE_FILE)) as f:
        trainable._iteration = int(json.load(f)["iteration"])
    returned = os.path.join(directory, _RETURNED_FILE)
    if os.path.exists(returned):
        with open(returned, "rb") as f:
            trainable.load_checkpoint(pickle.load(f))  # the trial's own, written above
    else:
        trainable.load_checkpoint(directory)
