"""Settings Ray users pass routinely that mean nothing on a Dask cluster: accepted, said once.

Ray's ``RunConfig(verbose=, progress_reporter=, log_to_file=, sync_config=)``,
``ScalingConfig(trainer_resources=, placement_strategy=)``, ``TuneConfig(reuse_actors=)`` and
``tune.run(verbose=, progress_reporter=, reuse_actors=)`` tune Ray's own machinery (its console
reporter, its syncing of trial folders to storage, its trainer actor, its placement groups,
its actor reuse). trainlib has none of that machinery, so a ported script keeps its lines: each
such setting is accepted, and the first time a process sees a value other than Ray's default,
a ``RayHintIgnored`` warning says once what trainlib does instead. ``SyncConfig`` and
``CLIReporter`` exist to be passed there (``from trainlib.tune import SyncConfig``).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

_SAID: set[tuple[str, str]] = set()
_SAID_LOCK = threading.Lock()

# what trainlib does instead of each setting, by name
INSTEAD = {
    "verbose": "trainlib reports through Python's logging (the 'trainlib' logger): set its level",
    "progress_reporter": (
        "trainlib reports through Python's logging (the 'trainlib' logger) and the callbacks "
        "of RunConfig(callbacks=...)"
    ),
    "log_to_file": "each rank's output goes to its Dask worker's log",
    "sync_config": (
        "ranks write checkpoints and results to storage_path themselves: nothing is synced"
    ),
    "trainer_resources": "the run's driver runs in the calling process, not on a cluster worker",
    "placement_strategy": (
        "ranks go to the Dask workers that declare the resources asked for, one rank each, "
        "hosts in address order"
    ),
    "reuse_actors": "each trial starts its own rank processes; there are no actors to reuse",
}


class RayHintIgnored(UserWarning):
    """A Ray setting that has no effect in trainlib (said once per setting and process)."""


def accept(owner: str, name: str, value: Any, ray_default: Any) -> None:
    """Say once (``RayHintIgnored``) that ``owner(name=value)`` has no effect, unless ``value``
    is Ray's default."""
    if value is None or value == ray_default:
        return
    with _SAID_LOCK:
        if (owner, name) in _SAID:
            return
        _SAID.add((owner, name))
    shown = repr(value)
    if len(shown) > 40:  # a SyncConfig or a reporter: its settings do not matter here
        shown = f"{type(value).__name__}(...)"
    warnings.warn(
        f"{owner}({name}={shown}) is accepted as in Ray but has no effect: {INSTEAD[name]}.",
        RayHintIgnored,
        stacklevel=4,
    )


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    """Ray's ``SyncConfig``, accepted for ``RunConfig(sync_config=...)``: trainlib syncs nothing
    (ranks write to ``storage_path`` themselves), so none of its settings has an effect."""

    sync_period: int = 300
    sync_timeout: int = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True
    upload_dir: Any = None
    syncer: Any = None
    sync_on_checkpoint: bool = True


@dataclass(kw_only=True)
class CLIReporter:
    """Ray Tune's ``CLIReporter`` (and ``JupyterNotebookReporter``), accepted for
    ``RunConfig(progress_reporter=...)``: trainlib has no console table of trials; it logs each
    trial's results and end through the ``trainlib`` logger."""

    metric_columns: Any = None
    parameter_columns: Any = None
    total_samples: int | None = None
    max_progress_rows: int = 20
    max_error_rows: int = 20
    max_column_length: int = 20
    max_report_frequency: int = 5
    infer_limit: int = 3
    print_intermediate_tables: bool | None = None
    metric: str | None = None
    mode: str | None = None
    sort_by_metric: bool = False
    added: dict[str, list[str]] = field(default_factory=dict)

    def add_metric_column(self, metric: str, representation: str | None = None) -> None:
        """Kept, as Ray keeps it, for a table trainlib does not print."""
        self.added.setdefault("metric", []).append(representation or metric)

    def add_parameter_column(self, parameter: str, representation: str | None = None) -> None:
        """Kept, as Ray keeps it, for a table trainlib does not print."""
        self.added.setdefault("parameter", []).append(representation or parameter)


JupyterNotebookReporter = CLIReporter
