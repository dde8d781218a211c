"""PyTorchTrainer: RaySGD's trainer, driven one call at a time on a live group of ranks."""

from __future__ import annotations

import functools
import os
import shutil
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import cloudpickle

from trainlib._internal.common.messages import Command
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.callbacks import Report
from trainlib.config import RunConfig
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError, WorkerGroupError
from trainlib.sgd import _runner, _setup
from trainlib.sgd.live_group import LiveGroup
from trainlib.torch_config import TorchConfig

if TYPE_CHECKING:
    from distributed import Client


class PyTorchTrainer:
    """Trains models built by creator functions on ``num_replicas`` ranks, one call at a time.

    The ranks start once, here, next to Dask workers (one each, as for ``TorchTrainer``), build
    the models, optimizers, schedulers, loss and data from the creators, and stay up:
    ``train()``, ``validate()``, ``save()``, ``restore()`` and ``get_model()`` are each one
    message to the formed group. ``shutdown()`` (or garbage collection) stops every rank.

    Args:
        model_creator: ``model_creator(config)`` returns a model or a tuple of models.
        data_creator: ``data_creator(batch_size, config)`` returns the train data, or a
            ``(train, validation)`` pair; each a ``DataLoader`` or a ``Dataset`` (loaded with
            ``batch_size``). Each rank reads its own shard (a ``DistributedSampler``).
        optimizer_creator: ``optimizer_creator(models, config)`` returns an optimizer or a
            tuple; ``models`` is what model_creator returned.
        loss_creator: A loss class (``torch.nn.MSELoss``), or ``loss_creator(config)``
            returning the criterion; None if a custom function needs none.
        scheduler_creator: ``scheduler_creator(optimizers, config)`` returns a scheduler or a
            tuple.
        train_function: ``train_function(config, models, train_iterator, criterion,
            optimizers, schedulers)`` runs one pass and returns a dict of metrics; by default
            ``trainlib.sgd.train_epoch``. Needed with several models.
        validation_function: ``validation_function(config, models, val_iterator, criterion,
            schedulers)`` returns a dict of metrics; by default ``trainlib.sgd.validate_epoch``.
        initialization_hook: Runs once in every rank process before it joins the process
            group and before any creator (set ``NCCL_*`` variables here); it takes no argument
            or one, the rank's ``trainlib.TrainContext``.
        config: The dict every creator and function gets.
        num_replicas: Number of ranks.
        use_gpu: One CUDA device per rank, NCCL.
        batch_size: The global batch size: each rank's data_creator gets
            ``batch_size // num_replicas``.
        use_fp16: Mixed precision: ``torch.autocast`` in float16 with a GradScaler on CUDA,
            bfloat16 on the CPU (see ``trainlib.sgd.MixedPrecision``).
        scheduler_step_freq: The default train function steps the scheduler after every
            ``"batch"`` or every ``"epoch"``.
        run_config: Where the run's checkpoints go (``storage_path``, ``name``; only the
            latest is kept), and ``failure_config.hang_timeout_s``: a call the ranks have not
            answered for that long fails as hung (without it, no hang watchdog; collectives
            still time out after ``TorchConfig.timeout_s``). ``callbacks`` get one report
            per call.
        dask_config: Which Dask cluster runs the ranks; a new LocalCluster by default,
            closed by ``shutdown()``.
        client: A connected ``distributed.Client`` to use instead of ``dask_config``.

    Raises:
        ConfigError: An argument is invalid (nothing is started).
        WorkerGroupError: A rank failed while building its objects.

    Example:
        >>> trainer = PyTorchTrainer(model_creator, data_creator, optimizer_creator,
        ...                          loss_creator=torch.nn.MSELoss, num_replicas=2)
        >>> trainer.train()["train_loss"]
        >>> trainer.shutdown()
    """

    def __init__(
        self,
        model_creator: Callable[..., Any],
        data_creator: Callable[..., Any],
        optimizer_creator: Callable[..., Any],
        loss_creator: Any = None,
        *,
        scheduler_creator: Callable[..., Any] | None = None,
        train_function: Callable[..., dict[str, Any]] | None = None,
        validation_function: Callable[..., dict[str, Any]] | None = None,
        initialization_hook: Callable[..., None] | None = None,
        config: dict[str, Any] | None = None,
        num_replicas: int = 1,
        use_gpu: bool = False,
        batch_size: int = 16,
        use_fp16: bool = False,
        scheduler_step_freq: Literal["batch", "epoch"] = "batch",
        run_config: RunConfig | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
    ) -> None:
        setup = _setup.runner_setup(
            model_creator,
            data_creator,
            optimizer_creator,
            loss_creator,
            scheduler_creator=scheduler_creator,
            train_function=train_function,
            validation_function=validation_function,
            config=config,
            num_replicas=num_replicas,
            batch_size=batch_size,
            use_fp16=use_fp16,
            scheduler_step_freq=scheduler_step_freq,
        )
        self._model_creator = model_creator
        self._config = setup.config
        plan = RunPlan(
            train_func_payload=cloudpickle.dumps(functools.partial(_runner.serve, setup)),
            scaling=_setup.scaling(num_replicas, use_gpu, initialization_hook),
            run_config=_setup.run_config(run_config),
            torch_config=TorchConfig(),
            dask_config=dask_config or DaskConfig(),
            default_name_prefix="PyTorchTrainer",
        )
        self._group: LiveGroup | None = None
        self._failure: WorkerGroupError | None = None
        self._group = LiveGroup.start(plan, client)
        self._close = weakref.finalize(self, self._group.close)

    def train(self, max_retries: int = 0, checkpoint: str = "auto") -> dict[str, Any]:
        """One pass over the training data on every rank.

        Args:
            max_retries: After a rank fails (a lost worker, a killed process), form a new
                group and run the pass again, this many times at most.
            checkpoint: What a new group resumes from: ``"auto"`` saves the state to the
                run's storage before the pass (only with ``max_retries > 0``); or the path
                of a file written by ``save()``.

        Returns:
            The train function's metrics, each number averaged over the ranks, plus
            ``epoch`` (passes so far).

        Raises:
            WorkerGroupError: A rank failed more than ``max_retries`` times.
        """
        if max_retries < 0:
            raise ConfigError(f"train(max_retries={max_retries}) must be >= 0.")
        if checkpoint != "auto" and not os.path.isfile(checkpoint):
            raise ConfigError(
                f"train(checkpoint={checkpoint!r}) must be 'auto' or a file written by save()."
            )
        first = None  # what a new group loads before the pass again
        if max_retries and checkpoint == "auto":
            self._call(Command(_runner.SAVE_STATE))  # a new group resumes from it
        elif max_retries:
            with open(checkpoint, "rb") as file:
                first = Command(_runner.LOAD_STATE, file.read())
        return self._call(Command(_runner.TRAIN), max_retries, first).metrics

    def validate(self) -> dict[str, Any]:
        """One pass over the validation data on every rank.

        Returns:
            The validation function's metrics, each number averaged over the ranks.
        """
        return self._call(Command(_runner.VALIDATE)).metrics

    def save(self, path: str) -> str:
        """Write the state (models, optimizers, schedulers, scaler, epoch) to the file ``path``.

        Returns:
            ``path``.
        """
        report = self._call(Command(_runner.SAVE_STATE))
        assert report.checkpoint is not None, "rank 0 reports the state as a checkpoint"
        with report.checkpoint.as_directory() as directory:
            shutil.copyfile(os.path.join(directory, _runner.STATE_FILE), path)
        return path

    def restore(self, path: str) -> None:
        """Load a state written by ``save()`` (of a trainer with the same creators) on every
        rank."""
        with open(path, "rb") as file:
            data = file.read()
        self._call(Command(_runner.LOAD_STATE, data))

    def get_model(self) -> Any:
        """The trained model(s) in this process, unwrapped, on the CPU.

        Returns:
            A model, or a tuple of models when model_creator returns several.
        """
        report = self._call(Command(_runner.SAVE_STATE))
        assert report.checkpoint is not None, "rank 0 reports the state as a checkpoint"
        state = _runner.load_state_bytes(_runner.read_state(report.checkpoint))
        created = self._model_creator(self._config)
        models = tuple(created) if isinstance(created, (tuple, list)) else (created,)
        for model, saved in zip(models, state["models"], strict=True):
            model.load_state_dict(saved)
        return models[0] if len(models) == 1 else models

    def shutdown(self) -> None:
        """Stop every rank (and the cluster this trainer started). Safe to call twice."""
        self._close()

    def _call(self, command: Command, restarts: int = 0, first: Command | None = None) -> Report:
        group = self._usable_group()
        try:
            return group.call(command, restarts, first)
        except WorkerGroupError as error:
            self._failure = error
            raise

    def _usable_group(self) -> LiveGroup:
        if self._group is None or not self._close.alive:
            raise RuntimeError("This PyTorchTrainer was shut down; create a new one.")
        if not self._group.is_formed:
            raise RuntimeError(
                "This PyTorchTrainer's ranks were stopped after a failure "
                f"({self._failure.root_cause.one_line() if self._failure else 'interrupted'}); "
                "create a new trainer, and restore() a state you saved, or pass "
                "train(max_retries=N) to re-form the group automatically."
            )
        return self._group
