"""Tuner: runs trials of a trainable over a search space on one Dask cluster, as Ray Tune's."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from functools import partial
from typing import TYPE_CHECKING, Any

from trainlib._internal.common.devices import usable_cores
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib.config import RunConfig, ScalingConfig
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError
from trainlib.torch.trainer import TorchTrainer
from trainlib.tune import saved_search
from trainlib.tune.callback import Trial
from trainlib.tune.config import TuneConfig
from trainlib.tune.flat_space import flatten
from trainlib.tune.result_grid import ResultGrid
from trainlib.tune.search_events import SearchEvents
from trainlib.tune.stopper import as_stopper, combined
from trainlib.tune.trainable import (
    as_trainer,
    check_not_local,
    check_trainer_space,
    sized,
    trial_plan,
    trial_sizes,
)
from trainlib.tune.trial_results import result_grid

if TYPE_CHECKING:
    from distributed import Client
    from fsspec import AbstractFileSystem

    from trainlib.tune._study import Failed, Study
    from trainlib.tune.trial_callback import TrialSetup


class Tuner:
    """Runs trials of ``trainable``, each with a config sampled from ``param_space``.

    Each trial is a trainlib run on the same Dask cluster, in its own directory
    ``{storage_path}/{name}/trial_NNNNN``, holding its ``num_workers`` workers while it runs.
    Optuna proposes the configs (``TuneConfig.search_alg``) and stops unpromising trials
    (``TuneConfig.scheduler``); its study is stored in ``{storage_path}/{name}/study.db``. As
    in Ray, a new Tuner runs a search of its own (beside earlier ones of the same name:
    ``saved_search``); ``Tuner.restore`` resumes the latest: trials that ended are kept,
    interrupted ones resume from their latest checkpoint.

    Args:
        trainable: A ``TorchTrainer`` (its ``train_loop_config`` is updated with
            ``param_space["train_loop_config"]``), a function of ``config`` that calls
            ``trainlib.report`` (it runs as a 1-rank trainlib run: a process of its own next
            to one Dask worker), or a trainable class with an ``as_torch_trainer``
            classmethod (``trainlib.sgd.PyTorchTrainable``: each trial's config is the
            trainer's arguments).
        param_space: The config of every trial: search space helpers (``tune.uniform``, ...)
            and plain values, nested as the trainable expects.
        tune_config: The metric to optimise, number of trials, concurrency, search and
            scheduler (``TuneConfig()`` if None: one trial, nothing compared).
        run_config: Name, storage, failure handling, callbacks and stopping conditions
            (``stop=``) of every trial run; replaces the trainer's own (as in Ray).
            ``FailureConfig.max_failures`` is per trial: a trial's run restarts from its
            latest checkpoint that often; ``FailureConfig(fail_fast=True)`` stops the search
            at the first failed trial.
        dask_config: The cluster of a function trainable (a TorchTrainer brings its own).
        client: A connected ``distributed.Client`` to use instead.

    Example:
        >>> tuner = Tuner(
        ...     trainer,
        ...     param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1)}},
        ...     tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8),
        ... )
        >>> best = tuner.fit().get_best_result()
    """

    def __init__(
        self,
        trainable: TorchTrainer | Callable[[dict[str, Any]], Any],
        *,
        param_space: Mapping[str, Any] | None = None,
        tune_config: TuneConfig | None = None,
        run_config: RunConfig | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
    ) -> None:
        self._is_function = not isinstance(trainable, TorchTrainer)
        self._trainable_name = getattr(trainable, "__name__", type(trainable).__name__)
        self._trainer = as_trainer(trainable, param_space or {}, run_config, dask_config, client)
        self._param_space = dict(param_space or {})
        self._sizes: ScalingConfig | None = None  # param_space["scaling_config"] of a trainer
        searched = dict(param_space or {})
        if isinstance(trainable, TorchTrainer):
            check_trainer_space(searched)
            self._sizes = searched.pop("scaling_config", None)
            if self._sizes is not None and self._sizes.searched:
                searched["scaling_config"] = self._sizes.searched
        check_not_local(self._num_workers())
        self._space = flatten(searched)
        self._tune_config = tune_config or TuneConfig()
        self._run_config = run_config or self._trainer.run_config
        as_stopper(self._run_config.stop)  # a wrong stop= fails here, not in every trial
        self._results: ResultGrid | None = None
        self._failed: Failed = "keep"  # Tuner.restore(resume_errored=, restart_errored=)
        self._resume_unfinished = True
        self._search: saved_search.Search | None = None  # this Tuner's, from its first fit()

    @classmethod
    def restore(
        cls,
        path: str,
        trainable: TorchTrainer | Callable[[dict[str, Any]], Any],
        *,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: Mapping[str, Any] | None = None,
        storage_filesystem: AbstractFileSystem | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
        run_config: RunConfig | None = None,
    ) -> Tuner:
        """The search stored at ``path`` (``{storage_path}/{name}``, on
        ``storage_filesystem`` if given), as Ray's ``Tuner.restore``: its param space,
        TuneConfig and RunConfig as its first ``fit()`` saved them (``tuner.pkl``), with
        ``trainable`` given again, stored on at ``path`` (which may have moved). Its ``fit()``
        keeps the trials that ended and runs the rest.

        Args:
            resume_unfinished: Trials interrupted (Ctrl-C, a dead driver) resume from their
                latest checkpoint; False ends them as failed.
            resume_errored: Failed trials resume from their latest checkpoint (same run).
            restart_errored: Failed trials run again from scratch, under a new run name.
            run_config: trainlib's: the RunConfig to go on with (callbacks that could not be
                pickled, say); None: the stored one. Its name and storage are ``path``'s.

        Raises:
            ConfigError: No search at ``path``, or both resume_errored and restart_errored.
        """
        failed = saved_search.failed_trials(resume_errored, restart_errored)
        saved = saved_search.read(path, storage_filesystem)
        tuner = cls(
            trainable,
            param_space=saved["param_space"] if param_space is None else param_space,
            tune_config=saved["tune_config"],
            run_config=saved_search.placed(run_config or saved["run_config"], saved),
            dask_config=dask_config,
            client=client,
        )
        tuner._failed, tuner._resume_unfinished = failed, resume_unfinished
        tuner._search = saved["search"]
        return tuner

    @classmethod
    def can_restore(cls, path: str) -> bool:
        """Whether ``path`` holds a search ``restore`` can resume."""
        return saved_search.exists(path)

    def fit(self) -> ResultGrid:
        """Run the search to its end and return every trial's result.

        Trials that raise are recorded (``ResultGrid.errors``) and the search goes on. Ctrl-C
        stops every running trial's ranks, then raises ``KeyboardInterrupt``;
        ``Tuner.restore`` (or this Tuner's next ``fit()``) resumes the search.

        Raises:
            NotEnoughWorkersError: No trial could start within ``DaskConfig.worker_timeout_s``.
        """
        # Imported on use (Dask, Optuna): a rank importing trainlib.tune stays light.
        from trainlib._internal.driver import cluster
        from trainlib._internal.worker import plugins
        from trainlib.tune._trials import TrialRunner

        name = self._run_config.name or datetime.now(timezone.utc).strftime(
            "Tuner_%Y-%m-%d_%H-%M-%S"
        )
        experiment = RunStorage.create(
            self._run_config.storage, name, self._run_config.storage_filesystem
        )
        self._search = self._search or saved_search.new_search(experiment)
        study = self._open_study(
            self._search, experiment, self._failed, resume_unfinished=self._resume_unfinished
        )
        self._failed, self._resume_unfinished = "keep", True  # once: the next fit() goes on
        stored = (self._param_space, self._tune_config, self._run_config)
        saved_search.save(experiment, self._search, *stored)
        trainer = self._trainer
        with (
            InterruptWatch(),
            cluster.connect(trainer.dask_config, self._cluster_size(), trainer.client) as client,
        ):
            plugins.install(client)  # fork servers start now
            events = SearchEvents.of(self._run_config.callbacks, experiment)
            runner = TrialRunner(client, study, self._setup(experiment, events))
            events.setup(self._run_config.stop, self._tune_config.num_samples, self._num_trials())
            outcomes = runner.run(max(0, self._num_trials() - study.counted_trials()))
            events.experiment_ended()
        self._results = self._grid(study, outcomes, experiment)
        return self._results

    def get_results(self) -> ResultGrid:
        """The results ``fit()`` returned; after ``Tuner.restore`` without ``fit()``, those of
        the stored search's trials that ended (as Ray's ``Tuner.get_results``).

        Raises:
            ConfigError: Neither: this Tuner was not fit and names no stored search.
        """
        if self._results is not None:
            return self._results
        name, config = self._run_config.name, self._run_config
        search = self._search or (
            saved_search.latest(posixpath.join(config.storage, name)) if name else None
        )
        if name is None or search is None:
            raise ConfigError(
                "Tuner.get_results(): call fit() first, or Tuner.restore(path, trainable) a "
                "search stored at {storage_path}/{name}."
            )
        experiment = RunStorage.create(config.storage, name, config.storage_filesystem)
        return self._grid(self._open_study(search, experiment), [], experiment)

    def _open_study(
        self,
        search: saved_search.Search,
        experiment: RunStorage,
        failed: Failed = "keep",
        resume_unfinished: bool = True,
    ) -> Study:
        from trainlib.tune._study import Study, StudySettings

        config = self._tune_config
        return Study.open(
            StudySettings.of(config, search.study, experiment),
            self._space.distributions(),
            self._space.grid_points(),
            config.num_samples,
            failed=failed,
            resume_unfinished=resume_unfinished,
        )

    def _num_trials(self) -> int:
        return self._tune_config.num_samples * len(self._space.grid_points())

    def _num_workers(self) -> int:
        """Workers of the largest trial."""
        if self._sizes is not None:
            return max(trial_sizes(self._sizes))
        return self._trainer.scaling_config.worker_range[1]

    def _trial_config(self, params: dict[str, Any], run_name: str) -> dict[str, Any]:
        """A trial's config; with ``param_space["scaling_config"]``, its ScalingConfig."""
        return sized(self._space.config(params, run_name), self._sizes)

    def _cluster_size(self) -> int:
        """Workers of a cluster the Tuner starts: enough for the trials that run at once."""
        concurrent = self._tune_config.concurrency or max(1, usable_cores() // self._num_workers())
        return self._num_workers() * min(concurrent, self._num_trials())

    def _setup(self, experiment: RunStorage, events: SearchEvents) -> TrialSetup:
        from trainlib.tune.schedulers.population import Population
        from trainlib.tune.trial_callback import TrialSetup

        scaling, config = self._trainer.scaling_config, self._tune_config
        return TrialSetup(
            make_plan=partial(trial_plan, self._trainer, self._run_config, self._is_function),
            config_of=self._trial_config,
            num_workers=self._num_workers(),
            resources=scaling.resources_per_worker,
            use_gpu=scaling.use_gpu,
            sized_by_config=self._sizes is not None,
            experiment_dir=experiment.run_dir,
            filesystem=experiment.filesystem,
            metric=config.metric,
            objectives=tuple(metric for metric, _ in config.objectives),
            max_t=config.scheduler.max_t,
            time_attr=config.scheduler.time_attr,
            naming=config.trial_naming,
            run_names=(self._search or saved_search.Search("", 1)).trial_names,
            trainable_name=self._trainable_name,
            max_concurrent=config.concurrency,
            worker_timeout_s=self._trainer.dask_config.worker_timeout_s,
            events=events,
            stopper=combined(self._run_config.stop, config.time_budget_s),
            fail_fast=self._run_config.failure_config.fail_fast,
            population=Population.of(
                config.scheduler, config.metric, config.mode, config.seed, experiment
            ),
        )

    def _grid(self, study: Study, outcomes: list[Trial], experiment: RunStorage) -> ResultGrid:
        checkpoints = self._run_config.checkpoint_config
        return result_grid(
            study, outcomes, experiment, self._tune_config, checkpoints, self._trial_config
        )
