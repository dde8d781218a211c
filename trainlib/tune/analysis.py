"""ExperimentAnalysis: a search's trials as Ray Tune's ``ExperimentAnalysis`` shows them.

``tune.run`` returns one, and ``ExperimentAnalysis(path)`` reads a stored search back (as
``Tuner.restore(path, ...).get_results()`` does, without the trainable). It is a
``ResultGrid`` too: ``get_best_result()`` and ``get_dataframe()`` work on it as on a Tuner's.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Literal

from trainlib.checkpoint import Checkpoint
from trainlib.errors import ConfigError
from trainlib.tune.callback import Trial
from trainlib.tune.result_grid import ResultGrid

if TYPE_CHECKING:
    import pandas as pd
    from fsspec import AbstractFileSystem

Mode = Literal["min", "max"]
_SCOPES = ("last", "avg", "last-5-avg", "last-10-avg", "all")


class ExperimentAnalysis(ResultGrid):
    """Every trial of a search, with Ray's ``ExperimentAnalysis`` accessors.

    Args:
        experiment_checkpoint_path: The search's directory, ``{storage_path}/{name}`` (a
            path or fsspec URL), of a Tuner or ``tune.run`` that was fit before.
        storage_filesystem: The fsspec filesystem of that path; inferred if omitted.
        default_metric, default_mode: What the ``best_*`` properties compare on; the
            search's own metric and mode by default.

    Raises:
        ConfigError: No search is stored at the path.
    """

    def __init__(
        self,
        experiment_checkpoint_path: str | os.PathLike[str],
        *,
        storage_filesystem: AbstractFileSystem | None = None,
        default_metric: str | None = None,
        default_mode: Mode | None = None,
    ) -> None:
        from trainlib.tune.tuner import Tuner

        path = os.fspath(experiment_checkpoint_path)
        tuner = Tuner.restore(path, _never_run, storage_filesystem=storage_filesystem)
        self._take(tuner.get_results(), default_metric, default_mode)

    @classmethod
    def of(cls, grid: ResultGrid) -> ExperimentAnalysis:
        """The analysis of results a search just returned."""
        analysis = cls.__new__(cls)
        analysis._take(grid, None, None)
        return analysis

    def _take(self, grid: ResultGrid, metric: str | None, mode: Mode | None) -> None:
        ResultGrid.__init__(
            self,
            list(grid),
            grid.trial_states,
            experiment_path=grid.experiment_path,
            metric=metric or grid._metric,
            mode=mode or grid._mode,
        )
        self.trials = [
            Trial(
                number=number,
                name=os.path.basename(result.path.rstrip("/")),
                config=result.config,
                state=state,  # type: ignore[arg-type]  # the grid's states are Trial's
                result=result,
                path=result.path,
                last_result=dict(result.metrics),
            )
            for number, (result, state) in enumerate(zip(self, self.trial_states, strict=True))
        ]

    @property
    def default_metric(self) -> str | None:
        return self._metric

    @property
    def default_mode(self) -> Mode | None:
        return self._mode

    def get_best_trial(
        self,
        metric: str | None = None,
        mode: Mode | None = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> Trial | None:
        """The trial whose ``metric`` is best, judged by its last result (``scope="last"``),
        the mean of all (``"avg"``) or of its last 5 or 10 (``"last-5-avg"``,
        ``"last-10-avg"``), or its best result (``"all"``); None when no trial has one."""
        metric, mode = self._metric_and_mode(metric, mode)
        if scope not in _SCOPES:
            raise ConfigError(f"get_best_trial(scope={scope!r}) must be one of {_SCOPES}.")
        scored = []
        for trial in self.trials:
            score = _score(trial, metric, mode, scope)
            if score is not None and (math.isfinite(score) or not filter_nan_and_inf):
                scored.append((score, trial.number, trial))
        if not scored:
            return None
        return (min if mode == "min" else max)(scored, key=lambda s: s[:2])[2]

    def get_best_config(
        self, metric: str | None = None, mode: Mode | None = None, scope: str = "last"
    ) -> dict[str, Any] | None:
        """The config of ``get_best_trial``."""
        best = self.get_best_trial(metric, mode, scope)
        return best.config if best is not None else None

    def get_best_checkpoint(
        self, trial: Trial, metric: str | None = None, mode: Mode | None = None
    ) -> Checkpoint | None:
        """``trial``'s kept checkpoint with the best ``metric``."""
        metric, mode = self._metric_and_mode(metric, mode)
        assert trial.result is not None  # every analysed trial ended
        return trial.result.get_best_checkpoint(metric, mode)

    def get_last_checkpoint(self, trial: Trial | None = None) -> Checkpoint | None:
        """``trial``'s latest checkpoint (the best trial's when None)."""
        trial = trial or self.best_trial
        return trial.checkpoint if trial is not None else None

    def get_all_configs(self) -> dict[str, dict[str, Any]]:
        """Each trial's config, by its path."""
        return {trial.path: trial.config for trial in self.trials}

    def get_trial_checkpoints_paths(
        self, trial: Trial, metric: str | None = None
    ) -> list[tuple[str, Any]]:
        """``trial``'s kept checkpoints as (path, value of ``metric``)."""
        metric = metric or self._metric or "training_iteration"
        kept = trial.result.best_checkpoints if trial.result is not None else []
        return [(checkpoint.path, metrics.get(metric)) for checkpoint, metrics in kept]

    def dataframe(self, metric: str | None = None, mode: Mode | None = None) -> pd.DataFrame:
        """One row per trial: its last result, or with ``metric`` and ``mode`` its best."""
        return self.get_dataframe(filter_metric=metric, filter_mode=mode)

    @property
    def best_trial(self) -> Trial | None:
        return self.get_best_trial()

    @property
    def best_config(self) -> dict[str, Any] | None:
        return self.get_best_config()

    @property
    def best_checkpoint(self) -> Checkpoint | None:
        best = self._best()
        return self.get_best_checkpoint(best)

    @property
    def best_logdir(self) -> str:
        return self._best().path

    @property
    def best_result(self) -> dict[str, Any]:
        return dict(self._best().last_result)

    @property
    def best_dataframe(self) -> pd.DataFrame:
        best = self._best()
        assert best.result is not None
        return best.result.metrics_dataframe

    @property
    def best_result_df(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([self.best_result], index=[self._best().trial_id])

    @property
    def results(self) -> dict[str, dict[str, Any]]:
        """Each trial's last result, by trial id."""
        return {trial.trial_id: dict(trial.last_result) for trial in self.trials}

    @property
    def results_df(self) -> pd.DataFrame:
        return self.get_dataframe().set_index("trial_id")

    @property
    def trial_dataframes(self) -> dict[str, pd.DataFrame]:
        """Each trial's results, one row per report, by trial id."""
        return {
            trial.trial_id: trial.result.metrics_dataframe
            for trial in self.trials
            if trial.result is not None
        }

    def _best(self) -> Trial:
        best = self.get_best_trial()
        if best is None:
            raise ConfigError(
                f"No trial of {self.experiment_path} reported a finite {self._metric!r}; "
                "check the metric name, or the trials' errors (errors)."
            )
        return best

    def _metric_and_mode(self, metric: str | None, mode: Mode | None) -> tuple[str, Mode]:
        metric, mode = metric or self._metric, mode or self._mode
        if metric is None or mode not in ("min", "max"):
            raise ConfigError(
                "ExperimentAnalysis needs a metric and a mode ('min' or 'max') to compare "
                "trials: pass them (get_best_trial(metric=..., mode=...)), or give "
                "default_metric= and default_mode= (the search had none)."
            )
        return metric, mode


def _score(trial: Trial, metric: str, mode: Mode, scope: str) -> float | None:
    last = trial.last_result.get(metric)
    if scope == "last" and isinstance(last, (int, float)):
        return float(last)
    history = trial.result.metrics_history if trial.result is not None else []
    values = [float(r[metric]) for r in history if isinstance(r.get(metric), (int, float))]
    if not values:
        return float(last) if isinstance(last, (int, float)) else None
    if scope == "all":
        return min(values) if mode == "min" else max(values)
    window = {"last": 1, "last-5-avg": 5, "last-10-avg": 10}.get(scope, len(values))
    chosen = values[-window:]
    return sum(chosen) / len(chosen)


def _never_run(config: dict[str, Any]) -> None:
    """The trainable of a search read back for its results only: no trial runs."""
    raise AssertionError("ExperimentAnalysis never runs a trial")
