"""A search's events delivered to its callbacks as Ray Tune delivers them: one at a time (trials
run in threads of their own; a lock keeps the hooks in order), each trial one ``Trial`` object
for the whole search, ``iteration`` the count of events so far. A trial on remote storage
writes its files to a local folder (``Trial.local_path``) uploaded when it ends."""

from __future__ import annotations

import inspect
import logging
import shutil
import tempfile
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem

from trainlib.tune.callback import Callback, Trial

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from trainlib._internal.common.storage import RunStorage
    from trainlib.checkpoint import Checkpoint

logger = logging.getLogger(__name__)


def _rays_trial_start(callback: Callback) -> bool:
    """Whether ``callback.on_trial_start`` has Ray's signature (``iteration, trials, trial``)."""
    try:
        return "iteration" in inspect.signature(callback.on_trial_start).parameters
    except (TypeError, ValueError):
        return False


class SearchEvents:
    """What a search's callbacks hear, in order."""

    def __init__(
        self, callbacks: Sequence[Callback], filesystem: AbstractFileSystem, experiment_dir: str
    ) -> None:
        self.callbacks = list(callbacks)
        self._filesystem = filesystem
        self._experiment_dir = experiment_dir
        self._local = isinstance(filesystem, LocalFileSystem)
        self._lock = threading.RLock()
        self._trials: dict[str, Trial] = {}
        self._iteration = 0

    @classmethod
    def of(cls, callbacks: Sequence[Any], experiment: RunStorage) -> SearchEvents:
        """The events of a search in ``experiment``: to the search callbacks among
        ``callbacks`` and Ray's default loggers (``trainlib.tune.logger``)."""
        from trainlib.tune.logger import with_default_loggers

        searching = [c for c in callbacks if isinstance(c, Callback)]
        return cls(with_default_loggers(searching), experiment.filesystem, experiment.run_dir)

    @property
    def trials(self) -> list[Trial]:
        """Every trial started so far, oldest first."""
        return list(self._trials.values())

    def setup(self, stop: Any, num_samples: int, total_num_samples: int) -> None:
        with self._lock:
            for callback in self.callbacks:
                callback.setup(
                    stop=stop, num_samples=num_samples, total_num_samples=total_num_samples
                )

    def trial(self, number: int, name: str, config: dict[str, Any]) -> Trial:
        """The trial's object (its folders are made when it starts)."""
        path = f"{self._experiment_dir}/{name}"
        return Trial(number, name, config, "running", path=path, local_path=path)

    def started(self, trial: Trial) -> None:
        """The trial's folders made (on remote storage, a local one holding the files its
        directory already has: a trial resumed goes on with them), then its start heard."""
        if self._local:
            self._filesystem.makedirs(trial.path, exist_ok=True)
        else:
            trial.local_path = tempfile.mkdtemp(prefix=f"trainlib-{trial.name}-")
            self._download(trial)
        with self._lock:
            self._trials[trial.name] = trial
            iteration, trials = self._next()
            for callback in self.callbacks:
                if _rays_trial_start(callback):
                    rays: Any = callback.on_trial_start
                    rays(iteration=iteration, trials=trials, trial=trial)
                else:
                    callback.on_trial_start(trial)

    def result(self, name: str, result: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        """A trial's result (with its auto-filled fields) and the checkpoint it committed."""
        with self._lock:
            trial = self._trials.get(name)
            if trial is None:  # a run started outside the search's trials
                return
            trial.last_result = {**result, "config": trial.config}
            iteration, trials = self._next()
            for callback in self.callbacks:
                callback.on_trial_result(
                    iteration=iteration, trials=trials, trial=trial, result=trial.last_result
                )
            if checkpoint is not None:
                for callback in self.callbacks:
                    callback.on_trial_save(iteration=iteration, trials=trials, trial=trial)
                for callback in self.callbacks:
                    callback.on_checkpoint(
                        iteration=iteration, trials=trials, trial=trial, checkpoint=checkpoint
                    )

    def ended(self, trial: Trial) -> None:
        """Ray's ``on_trial_complete`` or ``on_trial_error``, then ``on_trial_end``; the local
        folder of a trial on remote storage uploaded."""
        with self._lock:
            iteration, trials = self._next()
            for callback in self.callbacks:
                if trial.state == "failed":
                    callback.on_trial_error(iteration=iteration, trials=trials, trial=trial)
                else:
                    callback.on_trial_complete(iteration=iteration, trials=trials, trial=trial)
            for callback in self.callbacks:
                callback.on_trial_end(trial)
        self.left(trial)

    def left(self, trial: Trial) -> None:
        """A trial's local folder, on remote storage, uploaded (also a trial cut off by
        Ctrl-C: the search resumed goes on with its files)."""
        if not self._local and trial.local_path != trial.path:
            self._upload(trial)

    def experiment_ended(self) -> None:
        with self._lock:
            for callback in self.callbacks:
                callback.on_experiment_end(trials=self.trials)

    def _next(self) -> tuple[int, list[Trial]]:
        self._iteration += 1
        return self._iteration, self.trials

    def _download(self, trial: Trial) -> None:
        """The files (not the checkpoints' folders) of the trial's directory, if it has one."""
        try:
            listed = self._filesystem.ls(trial.path, detail=True)
        except FileNotFoundError:
            return
        for entry in listed:
            if entry["type"] == "file":
                name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
                self._filesystem.get_file(entry["name"], f"{trial.local_path}/{name}")

    def _upload(self, trial: Trial) -> None:
        try:
            self._filesystem.put(f"{trial.local_path}/", f"{trial.path}/", recursive=True)
        except Exception as error:  # its results are kept; only these files are not
            logger.warning(
                "Trial %s: its files in %s could not be uploaded to %s (%s); they are kept there",
                trial.name,
                trial.local_path,
                trial.path,
                error,
            )
            return
        shutil.rmtree(trial.local_path, ignore_errors=True)
