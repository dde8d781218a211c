"""Result: what ``TorchTrainer.fit()`` returns."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsspec import AbstractFileSystem

from trainlib._locations import locate
from trainlib.checkpoint import Checkpoint
from trainlib.errors import CheckpointError, RankFailure

if TYPE_CHECKING:
    import pandas as pd

PARAMS_FILE = "params.json"  # a Tune trial's config (trainlib.tune.logger writes them)
RESULT_FILE = "result.json"  # a Tune trial's results, a JSON object a line


@dataclass(frozen=True)
class Result:
    """The outcome of a training run.

    Attributes:
        metrics: The last metrics reported by rank 0 (``{}`` if none were).
        checkpoint: The latest committed checkpoint, or None.
        best_checkpoints: The kept checkpoints with their metrics, best first.
        path: The run directory on ``filesystem``.
        filesystem: The fsspec filesystem of the run directory.
        error: The error that ended the run, or None. ``fit()`` raises it; callbacks see it here.
        metrics_history: Every report of rank 0, oldest first (``metrics_dataframe`` as dicts).
        failures: The root cause of each failed attempt, oldest first.
        config: The configuration the run was given: a Tuner trial's sampled config (as in
            Ray's ``Result.config``); ``{}`` for a run started by ``fit()``.
    """

    metrics: dict[str, Any]
    checkpoint: Checkpoint | None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]]
    path: str
    filesystem: AbstractFileSystem
    error: BaseException | None = None
    metrics_history: list[dict[str, Any]] = field(default_factory=list)
    failures: list[RankFailure] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def num_restarts(self) -> int:
        """How often the worker group was restarted after a failure."""
        return len(self.failures) if self.error is None else max(0, len(self.failures) - 1)

    @property
    def metrics_dataframe(self) -> pd.DataFrame:
        """One row per report of rank 0, one column per metric."""
        import pandas as pd  # imported on use: rank processes never need pandas

        return pd.DataFrame(self.metrics_history)

    @classmethod
    def from_path(
        cls, path: str | os.PathLike[str], storage_filesystem: AbstractFileSystem | None = None
    ) -> Result:
        """The Result of a finished run, read back from its run directory (as Ray's).

        What storage keeps is what it has: a Tuner trial's ``metrics_history`` is every result
        its ``result.json`` holds (``trainlib.tune.logger``), its ``config`` its
        ``params.json``; elsewhere ``metrics_history`` is the checkpoints' metrics, oldest
        first. ``metrics`` is the last of those, ``best_checkpoints`` every committed
        checkpoint (newest first: the run's ``CheckpointConfig`` is not stored). ``error`` is
        None.

        Args:
            path: The run directory, ``{storage_path}/{name}`` (a path or fsspec URL).
            storage_filesystem: The fsspec filesystem of ``path``; inferred if omitted.

        Raises:
            CheckpointError: ``path`` is not a directory.
        """
        from trainlib._internal.common.storage import RunStorage

        storage_filesystem, root = locate(path, storage_filesystem)
        storage = RunStorage(storage_filesystem, root)
        if not storage_filesystem.isdir(storage.run_dir):
            raise CheckpointError(
                f"Result.from_path({os.fspath(path)!r}): no run directory there; pass the "
                "folder of one run, {storage_path}/{name}."
            )
        committed = storage.list_committed()
        latest = committed[-1] if committed else None
        logged = _read_json(storage_filesystem, f"{storage.run_dir}/{RESULT_FILE}", lines=True)
        history = _latest_per_iteration(
            [{k: v for k, v in r.items() if k != "config"} for r in logged]
        )
        return cls(
            metrics=history[-1] if history else dict(latest.metrics) if latest else {},
            checkpoint=latest.checkpoint if latest else None,
            best_checkpoints=[(c.checkpoint, c.metrics) for c in reversed(committed)],
            path=storage.run_dir,
            filesystem=storage_filesystem,
            metrics_history=history or [c.metrics for c in committed],
            config=_read_json(storage_filesystem, f"{storage.run_dir}/{PARAMS_FILE}") or {},
        )

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (as Ray's ``Result.get_best_checkpoint``).

        Checkpoints whose metrics lack ``metric`` are left out.

        Args:
            metric: The metric to order by.
            mode: ``"max"`` or ``"min"``.

        Raises:
            RuntimeError: The run has no checkpoint, or none has ``metric``.
            ValueError: ``mode`` is neither ``"max"`` nor ``"min"``.
        """
        if not self.best_checkpoints:
            raise RuntimeError(f"Run {self.path} has no checkpoint.")
        if mode not in ("max", "min"):
            raise ValueError(f"get_best_checkpoint(mode={mode!r}) must be 'max' or 'min'.")
        scored = [(c, m) for c, m in self.best_checkpoints if metric in m]
        if not scored:
            names = sorted({name for _, m in self.best_checkpoints for name in m})
            raise RuntimeError(
                f"No checkpoint of run {self.path} has metric {metric!r}; its checkpoints have "
                f"{names}."
            )
        choose = max if mode == "max" else min
        return choose(scored, key=lambda entry: entry[1][metric])[0]


def _read_json(filesystem: AbstractFileSystem, path: str, lines: bool = False) -> Any:
    """The JSON document at ``path`` (with ``lines``: a list, one a line), or None if there is
    none. A line cut short by a crash while it was written is left out."""
    try:
        text = filesystem.cat_file(path).decode()
    except FileNotFoundError:
        return [] if lines else None
    if not lines:
        return json.loads(text)
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _latest_per_iteration(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows by ``training_iteration``, the last written of each: a trial restarted from a
    checkpoint reported its later iterations again."""
    if not all(isinstance(row.get("training_iteration"), int) for row in rows):
        return rows
    by_iteration = {row["training_iteration"]: row for row in rows}
    return [by_iteration[iteration] for iteration in sorted(by_iteration)]
