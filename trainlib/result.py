"""Result: what ``TorchTrainer.fit()`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsspec import AbstractFileSystem

from trainlib.checkpoint import Checkpoint
from trainlib.errors import RankFailure

if TYPE_CHECKING:
    import pandas as pd


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
