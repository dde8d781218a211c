"""``tune.with_resources``: what each trial of a function trainable needs, in Dask's terms."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from trainlib.config import ScalingConfig
from trainlib.errors import ConfigError


class TrainableWithResources:
    """A function trainable and what each of its trials needs (``tune.with_resources``)."""

    def __init__(self, trainable: Callable[..., Any], resources: Mapping[str, float]) -> None:
        functools.update_wrapper(self, trainable)  # first: it copies the wrapped's attributes
        self.trainable = trainable
        self.resources = dict(resources)
        self.scaling = scaling_for(self.resources)  # checked now, as Ray checks it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cpus = self.resources.get("cpu")
        if cpus:  # the trial's rank runs on that many threads
            import torch

            torch.set_num_threads(max(1, int(cpus)))
        return self.trainable(*args, **kwargs)


def with_resources(
    trainable: Callable[..., Any], resources: Mapping[str, float]
) -> TrainableWithResources:
    """Ray Tune's ``tune.with_resources`` for a function trainable.

    Each trial runs as one rank on its own Dask worker, so ``resources`` says what that rank
    needs: ``"gpu": 1`` gives it a GPU (``use_gpu=True``), ``"cpu": n`` runs it on ``n``
    threads, any other name is a Dask worker resource (only workers started with
    ``--resources NAME=n`` take the trial).

    Raises:
        ConfigError: ``resources`` is not a mapping (a placement group factory, a function of
            the config), asks for more than one GPU (use a ``TorchTrainer`` with
            ``num_workers`` ranks), or names ``memory`` (Dask bounds a worker's memory:
            ``dask worker --memory-limit``).
    """
    if not isinstance(resources, Mapping):
        raise ConfigError(
            f"tune.with_resources(resources={resources!r}) must be a dict such as "
            '{"cpu": 2, "gpu": 1}: placement groups and functions of the config have no Dask '
            "counterpart (each trial runs on one Dask worker)."
        )
    return TrainableWithResources(trainable, resources)


def scaling_for(resources: Mapping[str, float]) -> ScalingConfig:
    """The one-rank ``ScalingConfig`` of a trial needing ``resources``."""
    gpus = resources.get("gpu", 0)
    if gpus not in (0, 1):
        raise ConfigError(
            f"tune.with_resources({{'gpu': {gpus}}}): a function trial runs one rank with at "
            "most one GPU; for more, tune a TorchTrainer with "
            "ScalingConfig(num_workers=..., use_gpu=True)."
        )
    if "memory" in resources:
        raise ConfigError(
            "tune.with_resources({'memory': ...}) has no per-trial counterpart: Dask bounds "
            "each worker's memory (dask worker --memory-limit), and a trial runs on one worker."
        )
    custom = {k: v for k, v in resources.items() if k not in ("cpu", "gpu")}
    return ScalingConfig(num_workers=1, use_gpu=gpus == 1, resources_per_worker=custom or None)
