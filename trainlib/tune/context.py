"""TuneContext: which trial a trainable runs as, as Ray Tune's ``tune.get_context()``."""

from __future__ import annotations

import posixpath
import warnings
from dataclasses import dataclass

from trainlib._internal.rank.process_globals import RANK


@dataclass(frozen=True)
class TuneContext:
    """The trial a function trainable runs as; get it with ``tune.get_context()``."""

    trial_name: str | None
    trial_dir: str | None
    experiment_name: str | None

    def get_trial_name(self) -> str | None:
        """The trial's name (``trial_00003``): its run name and directory name."""
        return self.trial_name

    def get_trial_id(self) -> str | None:
        """The trial's id: unique within its search (its name, as trainlib names trials)."""
        return self.trial_name

    def get_trial_dir(self) -> str | None:
        """The trial's directory (a path; a URL on remote storage): its checkpoints."""
        return self.trial_dir

    def get_experiment_name(self) -> str | None:
        """The search's name (the Tuner's ``RunConfig(name=...)``)."""
        return self.experiment_name


def get_context() -> TuneContext:
    """The current trial's TuneContext, inside a function trainable (in a plain trainlib run:
    the run, as a one-trial search would name it). Outside one, as in Ray, every value is
    None (with a warning): a trial function called directly still runs."""
    if RANK.session is None:
        warnings.warn(
            "tune.get_context() was called outside a Tune trial: its trial name, id, directory "
            "and experiment are None.",
            stacklevel=2,
        )
        return TuneContext(trial_name=None, trial_dir=None, experiment_name=None)
    spec = RANK.session.spec
    run_dir = spec.storage.run_dir.rstrip("/")
    protocols = spec.storage.filesystem.protocol
    local = "file" in (protocols if isinstance(protocols, (tuple, list)) else (protocols,))
    return TuneContext(
        trial_name=spec.run_name,
        trial_dir=run_dir if local else spec.storage.url(run_dir),
        experiment_name=posixpath.basename(posixpath.dirname(run_dir)),
    )
