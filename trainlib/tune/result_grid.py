"""ResultGrid: the trials of a search, as Ray Tune's ``ResultGrid``."""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from trainlib.errors import ConfigError
from trainlib.result import Result

if TYPE_CHECKING:
    import pandas as pd


class ResultGrid:
    """Every trial's ``Result`` (metrics, checkpoint, path, config, error), in trial order.

    Iterate over it, index it, or ask for the best trial.

    Attributes:
        experiment_path: The search's directory; each trial's run directory is inside it.
        trial_states: Each trial's end: ``"complete"``, ``"pruned"`` or ``"failed"``.
    """

    def __init__(
        self,
        results: Sequence[Result],
        trial_states: Sequence[str],
        *,
        experiment_path: str,
        metric: str | None,
        mode: Literal["min", "max"] | None,
    ) -> None:
        self._results = list(results)
        self.trial_states = list(trial_states)
        self.experiment_path = experiment_path
        self._metric = metric
        self._mode = mode

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Result:
        return self._results[index]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    @property
    def errors(self) -> list[BaseException]:
        """The errors of the trials that failed."""
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        """How many trials failed."""
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        """How many trials ended without an error (complete or pruned)."""
        return len(self._results) - self.num_errors

    def get_best_result(
        self, metric: str | None = None, mode: Literal["min", "max"] | None = None
    ) -> Result:
        """The trial whose last reported ``metric`` is best (TuneConfig's metric and mode by
        default); trials that failed or never reported it are skipped.

        Raises:
            ConfigError: No trial reported a finite value of ``metric``.
        """
        metric = metric or self._metric
        mode = mode or self._mode
        if metric is None:
            raise ConfigError(
                "get_best_result() needs the metric to compare the trials on: the search had "
                "none (TuneConfig(metric=None)); call get_best_result(metric=..., mode=...)."
            )
        if mode not in ("min", "max"):
            raise ConfigError(f"get_best_result(mode={mode!r}) must be 'min' or 'max'.")
        scored = [
            (float(r.metrics[metric]), i)
            for i, r in enumerate(self._results)
            if r.error is None and _is_finite_number(r.metrics.get(metric))
        ]
        if not scored:
            raise ConfigError(
                f"No trial of {self.experiment_path} reported a finite {metric!r}; check the "
                "metric name, or the trials' errors (ResultGrid.errors)."
            )
        pick = min if mode == "min" else max
        return self._results[pick(scored)[1]]

    def get_dataframe(
        self, filter_metric: str | None = None, filter_mode: Literal["min", "max"] | None = None
    ) -> pd.DataFrame:
        """One row per trial: its last metrics (with Ray's auto-filled fields such as
        ``time_total_s``), ``config/...`` columns, ``trial_id`` (its name, as
        ``tune.get_context().get_trial_id()`` gives it), ``state``, ``training_iteration``,
        ``path`` and ``error``. With ``filter_metric`` and ``filter_mode``, each trial's row
        holds its best report of that metric instead of its last (as Ray's)."""
        import pandas as pd

        if (filter_metric is None) != (filter_mode is None) or filter_mode not in (
            None,
            "min",
            "max",
        ):
            raise ConfigError(
                f"ResultGrid.get_dataframe(filter_metric={filter_metric!r}, filter_mode="
                f"{filter_mode!r}) needs both, with filter_mode 'min' or 'max', or neither."
            )
        rows = []
        for result, state in zip(self._results, self.trial_states, strict=True):
            row: dict[str, Any] = dict(result.metrics)
            row["training_iteration"] = len(result.metrics_history) or None
            if filter_metric is not None:
                row.update(_best_report(result.metrics_history, filter_metric, filter_mode))
            row.update({f"config/{k}": v for k, v in _flat(result.config).items()})
            row["trial_id"] = posixpath.basename(result.path.rstrip("/"))
            row["state"] = state
            row["path"] = result.path
            row["error"] = None if result.error is None else str(result.error)
            rows.append(row)
        return pd.DataFrame(rows)


def _best_report(history: list[dict[str, Any]], metric: str, mode: str | None) -> dict[str, Any]:
    """The best report of ``metric`` in ``history`` with its 1-based ``training_iteration``
    (nothing when no report has it as a number)."""
    scored = [
        (float(report[metric]), index)
        for index, report in enumerate(history)
        if _is_finite_number(report.get(metric))
    ]
    if not scored:
        return {}
    _, index = (min if mode == "min" else max)(scored)
    return {**history[index], "training_iteration": index + 1}


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
