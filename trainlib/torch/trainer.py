"""TorchTrainer: runs a training function on every rank of a Dask-hosted process group."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import cloudpickle

from trainlib._internal.driver.controller import run_training
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.checkpoint import Checkpoint
from trainlib.config import RunConfig, ScalingConfig
from trainlib.dask_config import DaskConfig
from trainlib.data_config import DataConfig
from trainlib.errors import ConfigError
from trainlib.result import Result
from trainlib.torch_config import TorchConfig
from trainlib.validation import ValidationConfig

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.common.datasets import DatasetSource


class TorchTrainer:
    """Runs ``train_loop_per_worker`` on ``num_workers`` ranks with torch.distributed set up.

    Each rank is a process started next to one Dask worker (see ``DaskConfig``). Ranks join a
    gloo (CPU) or NCCL (GPU) process group before the function starts.

    Args:
        train_loop_per_worker: The function every rank runs; takes no argument or one
            (``train_loop_config``).
        train_loop_config: Passed to the function (``{}`` if omitted and it takes one).
        scaling_config: Number of ranks and their resources.
        run_config: Name, storage, checkpoint retention, failure handling, callbacks.
        torch_config: Process-group backend and timeout.
        dask_config: Which Dask cluster to use; a new LocalCluster by default.
        client: A connected ``distributed.Client`` to use instead of ``dask_config``.
        resume_from_checkpoint: Checkpoint for ``get_checkpoint()`` when the run directory
            has none of its own yet.
        datasets: Dask collections the ranks read with ``trainlib.get_dataset_shard(name)``:
            a ``dask.dataframe.DataFrame`` or a dict of Dask arrays with one entry per row
            (see ``trainlib.data``).
        dataset_config: Which datasets are split across the ranks (all by default).
        validation_config: The function that validates the checkpoints reported with
            ``report(..., validation=...)``, as a Dask task while training goes on.

    Example:
        >>> trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))
        >>> result = trainer.fit()
        >>> result.metrics["loss"]
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        datasets: Mapping[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        validation_config: ValidationConfig | None = None,
    ) -> None:
        if validation_config is not None and not isinstance(validation_config, ValidationConfig):
            raise ConfigError(
                f"validation_config={validation_config!r} must be a "
                "trainlib.ValidationConfig(fn=...)."
            )
        self._validation = validation_config
        self._train_loop_per_worker = train_loop_per_worker
        self._train_loop_config = train_loop_config
        self._train_func = _bind_config(train_loop_per_worker, train_loop_config)
        self._scaling = scaling_config or ScalingConfig()
        if self._scaling.searched:
            raise ConfigError(
                f"TorchTrainer(scaling_config=ScalingConfig({self._scaling.searched})): a "
                "search over trial sizes goes in a Tuner: give the trainer a plain "
                "ScalingConfig and Tuner(trainer, param_space={'scaling_config': "
                "ScalingConfig(num_workers=tune.grid_search([...]))})."
            )
        self._run_config = run_config or RunConfig()
        self._torch = torch_config or TorchConfig()
        self._dask_config = dask_config or DaskConfig()
        self._client = client
        self._resume_from = resume_from_checkpoint
        self._data_config = dataset_config or DataConfig()
        self._datasets = _sources(datasets, self._data_config)

    @property
    def run_config(self) -> RunConfig:
        """The run's name, storage, checkpoints, failure handling and callbacks."""
        return self._run_config

    @property
    def scaling_config(self) -> ScalingConfig:
        """How many ranks the run has, and what each uses."""
        return self._scaling

    @property
    def dask_config(self) -> DaskConfig:
        """Where the run's Dask cluster comes from (a LocalCluster by default)."""
        return self._dask_config

    @property
    def client(self) -> Client | None:
        """The Dask client the run uses, if one was given (else ``dask_config`` makes one)."""
        return self._client

    def on_cluster(self, dask_config: DaskConfig | None, client: Client | None) -> TorchTrainer:
        """A copy of this trainer that runs on ``dask_config`` or ``client`` (None: this
        trainer's own); a Tuner given a cluster runs its trials there."""
        trainer = copy.copy(self)
        trainer._dask_config = dask_config or self._dask_config
        trainer._client = client or self._client
        return trainer

    def fit(self) -> Result:
        """Run training to the end and return its Result.

        Ctrl-C stops every rank first, then raises ``KeyboardInterrupt``.

        Raises:
            WorkerGroupError: A rank failed more often than ``FailureConfig.max_failures``.
            NotEnoughWorkersError: The cluster cannot provide ``num_workers`` workers.
        """
        if self._run_config.stop is not None:
            raise ConfigError(
                "RunConfig(stop=...) stops the trials of a search: give this trainer to "
                "trainlib.tune.Tuner, or end the run from the training function (return)."
            )
        return run_training(self._plan(), self._client)

    def _plan(self, train_loop_config: dict[str, Any] | None = None) -> RunPlan:
        """The run this trainer makes; a Tuner trial passes its ``train_loop_config``, merged
        into the trainer's own (nested dicts key by key, as Ray merges them)."""
        payload = self._train_func
        if train_loop_config is not None:
            merged = _merge(self._train_loop_config or {}, train_loop_config)
            payload = _bind_config(self._train_loop_per_worker, merged)
        return RunPlan(
            train_func_payload=payload,
            scaling=self._scaling,
            run_config=self._run_config,
            torch_config=self._torch,
            dask_config=self._dask_config,
            resume_from=self._resume_from,
            datasets=self._datasets,
            data_config=self._data_config,
            validation=self._validation,
        )


def _merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``update``; where both hold a dict, the dicts are merged."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _sources(datasets: Mapping[str, Any] | None, config: DataConfig) -> tuple[DatasetSource, ...]:
    if not datasets:
        return ()
    from trainlib._internal.common.datasets import sources_from  # Dask: only with datasets

    return tuple(sources_from(datasets, config).values())


def _bind_config(func: Callable[..., Any], config: dict[str, Any] | None) -> bytes:
    """Pickle ``func`` as a no-argument callable, with ``config`` bound if it takes one."""
    if not callable(func):
        raise ConfigError(f"train_loop_per_worker must be a function, got {func!r}.")
    required = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise ConfigError(
            f"train_loop_per_worker {func.__name__} takes {len(required)} arguments; "
            "it must take none or one (the train_loop_config dict)."
        )
    if not required and config is not None:
        raise ConfigError(
            f"train_loop_config was given but {func.__name__} takes no argument; "
            "add a config parameter or drop train_loop_config."
        )
    bound = functools.partial(func, dict(config or {})) if required else func
    return cloudpickle.dumps(bound)
