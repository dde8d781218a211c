"""``tune.with_parameters``: objects a function trainable takes besides its config."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from trainlib.errors import ConfigError
from trainlib.tune.resources import TrainableWithResources


class TrainableWithParameters:
    """A function trainable called as ``trainable(config, **parameters)``."""

    def __init__(self, trainable: Callable[..., Any], parameters: dict[str, Any]) -> None:
        functools.update_wrapper(self, trainable)  # first: it copies the wrapped's attributes
        self.trainable = trainable
        self.parameters = parameters

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.trainable(config, **self.parameters)


def with_parameters(
    trainable: Callable[..., Any], **parameters: Any
) -> TrainableWithParameters | TrainableWithResources:
    """Ray Tune's ``tune.with_parameters``: each trial calls ``trainable(config, **parameters)``.

    The objects (a dataset, a model) travel with the trial's function, pickled once per
    trial, and never enter the config, the results or the Optuna study. Combines with
    ``tune.with_resources`` either way round.

    Raises:
        ConfigError: ``trainable`` is not a function, or takes no argument of such a name.
    """
    if isinstance(trainable, TrainableWithResources):
        inner = with_parameters(trainable.trainable, **parameters)
        return TrainableWithResources(inner, trainable.resources)
    if isinstance(trainable, type) or not callable(trainable):
        raise ConfigError(
            f"tune.with_parameters({trainable!r}, ...) takes a function trainable "
            "(config, **parameters); a TorchTrainer takes them in its train_loop_config."
        )
    try:
        inspect.signature(trainable).bind({}, **parameters)
    except TypeError as exc:
        raise ConfigError(
            f"tune.with_parameters({getattr(trainable, '__name__', trainable)!r}, "
            f"{', '.join(parameters)}=...): the function cannot take them ({exc}); give it "
            "arguments of those names after config."
        ) from exc
    return TrainableWithParameters(trainable, parameters)
