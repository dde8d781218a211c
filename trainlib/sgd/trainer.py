"""PyTorchTrainer: RaySGD's trainer, driven one call at a time on a live group of ranks."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import shutil
import uuid
import weakref
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import cloudpickle
from torch import nn

from trainlib._internal.common.messages import Command
from trainlib._internal.driver.plan import RunPlan
from trainlib.callbacks import Report
from trainlib.config import CheckpointConfig, DaskConfig, RunConfig, ScalingConfig, TorchConfig
from trainlib.context import get_context
from trainlib.errors import ConfigError, WorkerGroupError
from trainlib.sgd import _runner
from trainlib.sgd._live_group import LiveGroup
from trainlib.sgd.functions import train_epoch, validate_epoch

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)


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
        setup = runner_setup(
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
            scaling=scaling(num_replicas, use_gpu, initialization_hook),
            run_config=_run_config(run_config),
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
        if max_retries and checkpoint == "auto":
            self._call(Command(_runner.SAVE_STATE))
        for retry in range(max_retries + 1):
            try:
                return self._call(Command(_runner.TRAIN)).metrics
            except WorkerGroupError as error:
                if retry == max_retries:
                    raise
                logger.warning("train() failed (%s); retrying.", error.root_cause.one_line())
                self._reform(None if checkpoint == "auto" else checkpoint)
        raise AssertionError("unreachable")

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

    def _call(self, command: Command) -> Report:
        group = self._usable_group()
        try:
            return group.call(command)
        except WorkerGroupError as error:
            self._failure = error
            raise

    def _reform(self, state_file: str | None) -> None:
        group = self._usable_group(reforming=True)
        group.reform()
        self._failure = None
        if state_file is not None:
            self.restore(state_file)

    def _usable_group(self, reforming: bool = False) -> LiveGroup:
        if self._group is None or not self._close.alive:
            raise RuntimeError("This PyTorchTrainer was shut down; create a new one.")
        if not reforming and not self._group.is_formed:
            raise RuntimeError(
                "This PyTorchTrainer's ranks were stopped after a failure "
                f"({self._failure.root_cause.one_line() if self._failure else 'interrupted'}); "
                "create a new trainer, and restore() a state you saved, or pass "
                "train(max_retries=N) to re-form the group automatically."
            )
        return self._group


def runner_setup(
    model_creator: Callable[..., Any],
    data_creator: Callable[..., Any],
    optimizer_creator: Callable[..., Any],
    loss_creator: Any = None,
    *,
    scheduler_creator: Callable[..., Any] | None = None,
    train_function: Callable[..., dict[str, Any]] | None = None,
    validation_function: Callable[..., dict[str, Any]] | None = None,
    config: dict[str, Any] | None = None,
    num_replicas: int = 1,
    batch_size: int = 16,
    use_fp16: bool = False,
    scheduler_step_freq: Literal["batch", "epoch"] = "batch",
) -> _runner.RunnerSetup:
    """What every rank needs of PyTorchTrainer's arguments, checked.

    Raises:
        ConfigError: An argument is invalid.
    """
    _check_arguments(
        model_creator, data_creator, optimizer_creator, scheduler_creator, num_replicas
    )
    _check_batch(batch_size, num_replicas, scheduler_step_freq)
    _check_signature("train_function", train_function, 6)
    _check_signature("validation_function", validation_function, 5)
    return _runner.RunnerSetup(
        model_creator=model_creator,
        data_creator=data_creator,
        optimizer_creator=optimizer_creator,
        loss_creator=loss_creator,
        scheduler_creator=scheduler_creator,
        train_function=train_function or train_epoch,
        validation_function=validation_function or validate_epoch,
        config=dict(config or {}),
        batch_size=batch_size // num_replicas,
        use_fp16=use_fp16,
        scheduler_step_freq=scheduler_step_freq,
    )


def scaling(
    num_replicas: int, use_gpu: bool, initialization_hook: Callable[..., None] | None
) -> ScalingConfig:
    """The ranks of a PyTorchTrainer: one per replica, the hook as their worker_setup."""
    return ScalingConfig(
        num_workers=num_replicas, use_gpu=use_gpu, worker_setup=_hook(initialization_hook)
    )


def _run_config(given: RunConfig | None) -> RunConfig:
    """The user's RunConfig (or the default) with a unique name and only the latest
    checkpoint kept: two trainers started in the same second never share a directory."""
    config = given or RunConfig()
    name = config.name or datetime.now(timezone.utc).strftime(
        f"PyTorchTrainer_%Y-%m-%d_%H-%M-%S_{uuid.uuid4().hex[:6]}"
    )
    return replace(config, name=name, checkpoint_config=CheckpointConfig(num_to_keep=1))


def _hook(hook: Callable[..., None] | None) -> Callable[[], None] | None:
    """initialization_hook as ScalingConfig.worker_setup (which takes no argument)."""
    if hook is None:
        return None
    if not callable(hook):
        raise ConfigError(f"initialization_hook must be a function, got {hook!r}.")
    required = _required_positional(hook)
    if required > 1:
        raise ConfigError(
            f"initialization_hook {hook.__name__} takes {required} arguments; it must take "
            "none or one (the rank's TrainContext)."
        )
    return functools.partial(_call_hook, hook, required == 1)


def _call_hook(hook: Callable[..., None], with_context: bool) -> None:
    if with_context:
        hook(get_context())
    else:
        hook()


def _required_positional(func: Callable[..., Any]) -> int:
    return len(
        [
            p
            for p in inspect.signature(func).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    )


def _check_arguments(
    model_creator: Any,
    data_creator: Any,
    optimizer_creator: Any,
    scheduler_creator: Any,
    num_replicas: int,
) -> None:
    for name, creator in (
        ("model_creator", model_creator),
        ("data_creator", data_creator),
        ("optimizer_creator", optimizer_creator),
        ("scheduler_creator", scheduler_creator),
    ):
        if creator is not None and (not callable(creator) or isinstance(creator, nn.Module)):
            raise ConfigError(
                f"{name} must be a function that returns the object, got {creator!r}; "
                "e.g. pass `lambda config: model`."
            )
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ConfigError(f"PyTorchTrainer(num_replicas={num_replicas!r}) must be an int >= 1.")


def _check_batch(batch_size: int, num_replicas: int, step_freq: str) -> None:
    if batch_size < num_replicas or batch_size % num_replicas:
        raise ConfigError(
            f"PyTorchTrainer(batch_size={batch_size}) must be a multiple of "
            f"num_replicas={num_replicas}: each rank loads batch_size // num_replicas."
        )
    if step_freq not in ("batch", "epoch"):
        raise ConfigError(
            f"PyTorchTrainer(scheduler_step_freq={step_freq!r}) must be 'batch' or 'epoch'."
        )


def _check_signature(name: str, func: Callable[..., Any] | None, num_arguments: int) -> None:
    """The function must take the arguments PyTorchTrainer passes, in RaySGD's order."""
    if func is None:
        return
    expected = (
        "(config, models, train_iterator, criterion, optimizers, schedulers)"
        if num_arguments == 6
        else "(config, models, val_iterator, criterion, schedulers)"
    )
    try:
        inspect.signature(func).bind(*([None] * num_arguments))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{name} {getattr(func, '__name__', func)!r} cannot take the arguments "
            f"{expected} ({exc}); give it that signature (schedulers may default to None)."
        ) from exc
