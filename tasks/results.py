"""What the training and search tasks return to their flows (plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainedRun:
    """A finished training run: its MLflow run, its best checkpoint (by val_accuracy)."""

    run_id: str
    best_checkpoint_uri: str
    best_metrics: dict[str, Any]
    final_metrics: dict[str, Any]
    run_path: str
