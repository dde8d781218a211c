"""TuneContext: which trial a trainable runs as, as Ray Tune's ``tune.get_context()``."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from trainlib._internal.rank.state import current_session


@dataclass(frozen=True)
class TuneContext:
    """The trial a function trainable runs as; get it with ``tune.get_context()``."""

    trial_name: str
    trial_dir: str
    experiment_name: str

    def get_trial_name(self) -> str:
        """The trial's name (``trial_00003``): its run name and directory name."""
        return self.trial_name

    def get_trial_id(self) -> str:
        """The trial's id: unique within its search (its name, as trainlib names trials)."""
        return self.trial_name

    def get_trial_dir(self) -> str:
        """The trial's directory (a path; a URL on remote storage): its checkpoints."""
        return self.trial_dir

    def get_experiment_name(self) -> str:
        """The search's name (the Tuner's ``RunConfig(name=...)``)."""
        return self.experiment_name


def get_context() -> TuneContext:
    """The current trial's TuneContext, inside a function trainable (in a plain trainlib run:
    the run, as a one-trial search would name it).

    Raises:
        RuntimeError: Called outside a trainable.
    """
    spec = current_session("tune.get_context()").spec
    run_dir = spec.storage.run_dir.rstrip("/")
    protocols = spec.storage.filesystem.protocol
    local = "file" in (protocols if isinstance(protocols, (tuple, list)) else (protocols,))
    return TuneContext(
        trial_name=spec.run_name,
        trial_dir=run_dir if local else spec.storage.url(run_dir),
        experiment_name=posixpath.basename(posixpath.dirname(run_dir)),
    )
