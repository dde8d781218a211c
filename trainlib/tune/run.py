"""``tune.run``: the older, one-call form of a search (Ray Tune's ``tune.run``)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from trainlib.config import DEFAULT_STORAGE_PATH, FailureConfig, RunConfig
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError
from trainlib.ray_hints import SyncConfig
from trainlib.torch.trainer import TorchTrainer
from trainlib.tune.analysis import ExperimentAnalysis
from trainlib.tune.config import TuneConfig
from trainlib.tune.schedulers import FIFOScheduler, TrialScheduler
from trainlib.tune.search import Searcher
from trainlib.tune.stopper import Stop
from trainlib.tune.tuner import Tuner

if TYPE_CHECKING:
    from distributed import Client


def run(
    run_or_experiment: TorchTrainer | Callable[[dict[str, Any]], Any] | type,
    *,
    config: Mapping[str, Any] | None = None,
    stop: Stop | None = None,
    metric: str | None = None,
    mode: Literal["min", "max"] | None = None,
    num_samples: int = 1,
    max_concurrent_trials: int | None = None,
    search_alg: Searcher | None = None,
    scheduler: TrialScheduler | None = None,
    time_budget_s: float | timedelta | None = None,
    fail_fast: bool | Literal["raise"] = False,
    name: str | None = None,
    storage_path: str = DEFAULT_STORAGE_PATH,
    dask_config: DaskConfig | None = None,
    client: Client | None = None,
    verbose: Any = None,
    progress_reporter: Any = None,
    reuse_actors: bool | None = None,
    sync_config: SyncConfig | None = None,
    log_to_file: bool | str | tuple[str, str] = False,
    resume: bool | str = False,
) -> ExperimentAnalysis:
    """``Tuner(run_or_experiment, param_space=config, ...).fit()`` in one call.

    ``stop`` is ``RunConfig(stop=...)``: a dict of results to reach, a function
    ``(trial_id, result) -> bool`` or a ``tune.Stopper``. Returns an ``ExperimentAnalysis``, as
    Ray's (``best_config``, ``best_trial``, ``dataframe()``...), which is a ``ResultGrid``
    too (``get_best_result()``). ``verbose``, ``progress_reporter``, ``reuse_actors``,
    ``sync_config`` and ``log_to_file`` are Ray's, accepted for ported scripts
    (``trainlib.ray_hints``). ``resume`` as Ray's: False, a new search; ``"AUTO"``, the search
    stored under ``name`` goes on if there is one (``Tuner.restore``), else a new one; True,
    ``"LOCAL"`` or ``"REMOTE"``, it must be there; a suffix ``+ERRORED`` resumes failed
    trials, ``+RESTART_ERRORED`` runs them again from scratch, ``_ONLY`` after either leaves
    interrupted trials ended.

    Example:
        >>> grid = tune.run(train_fn, config={"lr": tune.loguniform(1e-4, 1e-1)},
        ...                 num_samples=8, metric="loss", mode="min")
    """
    tune_config = TuneConfig(
        metric=metric,
        mode=mode,
        num_samples=num_samples,
        max_concurrent_trials=max_concurrent_trials,
        search_alg=search_alg,
        scheduler=scheduler or FIFOScheduler(),  # Ray's default: no trial stopped early
        time_budget_s=time_budget_s,
        reuse_actors=reuse_actors,
    )
    run_config = RunConfig(
        name=name,
        storage_path=storage_path,
        stop=stop,
        failure_config=FailureConfig(fail_fast=fail_fast),
        verbose=verbose,
        progress_reporter=progress_reporter,
        sync_config=sync_config,
        log_to_file=log_to_file,
    )
    restore = _resumed(resume, name, storage_path)
    if restore is not None:
        unfinished, errored, restarted = restore
        tuner = Tuner.restore(
            posixpath.join(storage_path, name or ""),
            run_or_experiment,
            resume_unfinished=unfinished,
            resume_errored=errored,
            restart_errored=restarted,
            dask_config=dask_config,
            client=client,
        )
    else:
        tuner = Tuner(
            run_or_experiment,
            param_space=config,
            tune_config=tune_config,
            run_config=run_config,
            dask_config=dask_config,
            client=client,
        )
    return ExperimentAnalysis.of(tuner.fit())


_SUFFIXES = {  # Tuner.restore's resume_unfinished, resume_errored, restart_errored
    "": (True, False, False),
    "+ERRORED": (True, True, False),
    "+RESTART_ERRORED": (True, False, True),
    "+ERRORED_ONLY": (False, True, False),
    "+RESTART_ERRORED_ONLY": (False, False, True),
}


def _resumed(
    resume: bool | str, name: str | None, storage_path: str
) -> tuple[bool, bool, bool] | None:
    """``Tuner.restore``'s flags (``_SUFFIXES``) for Ray's ``resume=``; None: a new search.

    Raises:
        ConfigError: A ``resume`` Ray does not take, ``"PROMPT"``, or a search that must be
            resumed and is not stored under ``name``.
    """
    if resume is False or resume is None:
        return None
    text = "LOCAL" if resume is True else str(resume).upper()
    base, plus, suffix = text.partition("+")
    if base not in ("AUTO", "LOCAL", "REMOTE") or plus + suffix not in _SUFFIXES:
        raise ConfigError(
            f"tune.run(resume={resume!r}): give False, True, 'AUTO', 'LOCAL' or 'REMOTE', "
            "optionally + 'ERRORED', 'RESTART_ERRORED', 'ERRORED_ONLY' or "
            "'RESTART_ERRORED_ONLY' ('PROMPT' asks at a terminal: not here)."
        )
    stored = name is not None and Tuner.can_restore(posixpath.join(storage_path, name))
    if not stored and base != "AUTO":
        raise ConfigError(
            f"tune.run(resume={resume!r}): no search is stored under name={name!r} in "
            f"{storage_path}; give the name of an earlier search, or resume='AUTO' to start "
            "one when there is none."
        )
    return _SUFFIXES[plus + suffix] if stored else None
