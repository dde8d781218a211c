"""PyTorchTrainer's arguments, checked and turned into what its ranks and its runs need."""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Literal

from torch import nn

from trainlib.config import CheckpointConfig, RunConfig, ScalingConfig
from trainlib.context import get_context
from trainlib.errors import ConfigError
from trainlib.sgd import _runner
from trainlib.sgd.functions import train_epoch, validate_epoch


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


def run_config(given: RunConfig | None) -> RunConfig:
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
