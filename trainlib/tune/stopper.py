"""Stopping conditions, as Ray Tune's ``ray.tune.stopper``.

``RunConfig(stop=...)`` takes a ``Stopper``, a dict or a function. The stopper sees every result
of every trial, in the order they arrive (the trial's reported metrics with Ray's auto-filled
fields: ``training_iteration``, ``time_total_s``, ``time_this_iter_s``, ``timestamp``,
``trial_id``, ...): ``stopper(trial_id, result)`` True ends that trial (as complete, with that
result as its last); ``stopper.stop_all()`` True ends every running trial and starts no more
(checked after each result and while the search waits).

- a dict ``{"training_iteration": 10, "mean_accuracy": 0.98}`` stops a trial once any of its
  results reaches any of the values (``result[key] >= value``);
- a function ``(trial_id, result) -> bool`` stops the trial when it returns True.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal

from trainlib.errors import ConfigError

logger = logging.getLogger(__name__)


class Stopper:
    """Decides when trials, or the whole search, stop. Subclass it and override both methods."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Whether the trial ``trial_id`` stops after this ``result``."""
        raise NotImplementedError

    def stop_all(self) -> bool:
        """Whether every trial stops now and no new trial starts."""
        raise NotImplementedError


class NoopStopper(Stopper):
    """Stops nothing."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class FunctionStopper(Stopper):
    """A function ``(trial_id, result) -> bool`` as a stopper; it never stops the search."""

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]) -> None:
        if not callable(function):
            raise ConfigError(f"FunctionStopper({function!r}) needs a function (trial_id, result).")
        self._function = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._function(trial_id, result))

    def stop_all(self) -> bool:
        return False


class CombinedStopper(Stopper):
    """Stops a trial (or the search) when any of ``stoppers`` says so; each sees every result."""

    def __init__(self, *stoppers: Stopper) -> None:
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        decisions = [stopper(trial_id, result) for stopper in self._stoppers]  # all of them
        return any(decisions)

    def stop_all(self) -> bool:
        return any([stopper.stop_all() for stopper in self._stoppers])


class MaximumIterationStopper(Stopper):
    """Stops each trial after ``max_iter`` results."""

    def __init__(self, max_iter: int) -> None:
        if max_iter < 1:
            raise ConfigError(f"MaximumIterationStopper(max_iter={max_iter}) must be >= 1.")
        self._max_iter = max_iter
        self._seen: defaultdict[str, int] = defaultdict(int)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        self._seen[trial_id] += 1
        return self._seen[trial_id] >= self._max_iter

    def stop_all(self) -> bool:
        return False


class TimeoutStopper(Stopper):
    """Stops the search once ``timeout`` (seconds or a ``timedelta``) has passed since its
    first result: the start-up of the cluster and of the first trial's ranks (seconds on a
    busy machine) is not charged to it."""

    def __init__(self, timeout: float | timedelta) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ConfigError(
                f"TimeoutStopper(timeout={timeout!r}) must be a positive number of seconds or a "
                "datetime.timedelta."
            )
        self._timeout_s = float(seconds)
        self._started: float | None = None
        self._lock = threading.Lock()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        with self._lock:
            if self._started is None:
                self._started = time.monotonic()
        return False

    def stop_all(self) -> bool:
        with self._lock:
            if self._started is None or time.monotonic() - self._started < self._timeout_s:
                return False
        logger.info("Search stopped: its time budget of %.0f s is spent", self._timeout_s)
        return True


class TrialPlateauStopper(Stopper):
    """Stops a trial whose ``metric`` has plateaued: the standard deviation of its last
    ``num_results`` values is below ``std``, after at least ``grace_period`` results and, with
    ``metric_threshold``, once the value is at least that good (``mode`` says which way)."""

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: float | None = None,
        mode: Literal["min", "max"] | None = None,
    ) -> None:
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ConfigError(
                f"TrialPlateauStopper(metric_threshold={metric_threshold}) needs mode='min' or "
                "'max' to know which side of the threshold is good."
            )
        if num_results < 1:
            raise ConfigError(f"TrialPlateauStopper(num_results={num_results}) must be >= 1.")
        self._metric, self._std = metric, std
        self._num_results, self._grace_period = num_results, grace_period
        self._threshold, self._mode = metric_threshold, mode
        self._seen: defaultdict[str, int] = defaultdict(int)
        self._windows: defaultdict[str, deque[float]] = defaultdict(
            lambda: deque(maxlen=num_results)
        )

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = float(_metric(result, self._metric, type(self).__name__))
        self._seen[trial_id] += 1
        window = self._windows[trial_id]
        window.append(value)
        if self._seen[trial_id] < self._grace_period or len(window) < self._num_results:
            return False
        if self._threshold is not None and not _reached(value, self._threshold, self._mode):
            return False
        return statistics.pstdev(window) < self._std

    def stop_all(self) -> bool:
        return False


class ExperimentPlateauStopper(Stopper):
    """Stops the search once the ``top`` best values of ``metric`` over all results have had a
    standard deviation of at most ``std`` for ``patience`` results in a row (at the first
    such result with ``patience`` 0 or 1), as Ray's."""

    def __init__(
        self,
        metric: str,
        std: float = 0.001,
        top: int = 10,
        mode: Literal["min", "max"] = "min",
        patience: int = 0,
    ) -> None:
        if mode not in ("min", "max"):
            raise ConfigError(f"ExperimentPlateauStopper(mode={mode!r}) must be 'min' or 'max'.")
        if top < 1 or patience < 0:
            raise ConfigError(
                f"ExperimentPlateauStopper(top={top}, patience={patience}) needs top >= 1 and "
                "patience >= 0."
            )
        self._metric, self._std, self._top = metric, std, top
        self._mode, self._patience = mode, patience
        self._best: list[float] = []
        self._plateaued_for = 0

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = float(_metric(result, self._metric, type(self).__name__))
        ranked = sorted([*self._best, value], reverse=self._mode == "max")
        self._best = ranked[: self._top]
        self._plateaued_for = self._plateaued_for + 1 if self._plateaued() else 0
        return self.stop_all()

    def _plateaued(self) -> bool:
        return len(self._best) == self._top and statistics.pstdev(self._best) <= self._std

    def stop_all(self) -> bool:
        return self._plateaued() and self._plateaued_for >= self._patience


class _CriteriaStopper(Stopper):
    """``RunConfig(stop={key: value, ...})``: a trial stops once ``result[key] >= value``
    for any key."""

    def __init__(self, criteria: Mapping[str, float]) -> None:
        for key, bound in criteria.items():
            if not isinstance(key, str) or not isinstance(bound, (int, float)):
                raise ConfigError(
                    f"RunConfig(stop={dict(criteria)!r}): each key must be a result's name and "
                    "each value a number (a trial stops once result[key] >= value)."
                )
        self._criteria = dict(criteria)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return any(
            _metric(result, key, f"RunConfig(stop={self._criteria!r})") >= bound
            for key, bound in self._criteria.items()
        )

    def stop_all(self) -> bool:
        return False


Stop = Mapping[str, float] | Callable[[str, dict[str, Any]], bool] | Stopper


def as_stopper(stop: Stop | None) -> Stopper | None:
    """The stopper that ``RunConfig(stop=...)`` describes (None: nothing to stop on)."""
    if stop is None or isinstance(stop, Stopper):
        return stop
    if isinstance(stop, Mapping):
        return _CriteriaStopper(stop) if stop else None
    if callable(stop):
        return FunctionStopper(stop)
    raise ConfigError(
        f"RunConfig(stop={stop!r}) must be a dict of results to reach (e.g. "
        "{'training_iteration': 10}), a function (trial_id, result) -> bool, or a tune.Stopper."
    )


def _metric(result: Mapping[str, Any], key: str, who: str) -> Any:
    if key not in result:
        raise ConfigError(
            f"{who}: the trial's result has no {key!r}; it has {sorted(result)}. Report it "
            "(trainlib.report({...})) or stop on one of those."
        )
    value = result[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{who}: the trial's {key!r} is {value!r}, not a number to compare.")
    return value


def _reached(value: float, threshold: float, mode: str | None) -> bool:
    return value <= threshold if mode == "min" else value >= threshold


def combined(stop: Any, time_budget_s: float | timedelta | None) -> Stopper | None:
    """``RunConfig(stop=...)`` and ``TuneConfig(time_budget_s=...)`` as one stopper (None:
    neither)."""
    stoppers = [as_stopper(stop)]
    if time_budget_s is not None:
        stoppers.append(TimeoutStopper(time_budget_s))
    found = [stopper for stopper in stoppers if stopper is not None]
    if len(found) < 2:
        return found[0] if found else None
    return CombinedStopper(*found)
