"""``tune.with_resources``: what each trial of a function trainable needs, in Dask's terms
(a dict, or Ray's ``PlacementGroupFactory`` of bundles)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from trainlib import ray_hints
from trainlib.config import ScalingConfig
from trainlib.errors import ConfigError

_RAY_NAMES = {"CPU": "cpu", "GPU": "gpu"}  # Ray's names in a bundle or a dict


class PlacementGroupFactory:
    """Ray Tune's ``PlacementGroupFactory(bundles, strategy="PACK")``: what one trial needs,
    as bundles of resources (``[{"CPU": 2, "GPU": 1}]``).

    A trial of a function trainable is one rank on one Dask worker, so it needs the bundles'
    sum (``required_resources``), on one worker; ``strategy`` places bundles on Ray's nodes
    and has no effect here (said once, as Ray's other placement hints).
    """

    def __init__(
        self, bundles: list[dict[str, float]], strategy: str = "PACK", *args: Any, **kwargs: Any
    ) -> None:
        if not bundles or not all(isinstance(bundle, Mapping) for bundle in bundles):
            raise ConfigError(
                f"PlacementGroupFactory(bundles={bundles!r}) must be a non-empty list of dicts "
                'such as [{"CPU": 2, "GPU": 1}].'
            )
        ray_hints.accept("PlacementGroupFactory", "placement_strategy", strategy, "PACK")
        self.bundles = [dict(bundle) for bundle in bundles]
        self.strategy = strategy

    @property
    def head_bundle_is_empty(self) -> bool:
        """Ray's: the first bundle asks for nothing."""
        return not any(self.bundles[0].values())

    @property
    def required_resources(self) -> dict[str, float]:
        """The bundles' sum, by Ray's resource names."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0) + amount
        return total

    def __repr__(self) -> str:
        return f"PlacementGroupFactory({self.bundles!r}, strategy={self.strategy!r})"


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
    trainable: Callable[..., Any], resources: Mapping[str, float] | PlacementGroupFactory
) -> TrainableWithResources:
    """Ray Tune's ``tune.with_resources`` for a function trainable.

    Each trial runs as one rank on its own Dask worker, so ``resources`` says what that rank
    needs: ``"gpu": 1`` gives it a GPU (``use_gpu=True``), ``"cpu": n`` runs it on ``n``
    threads (Ray's ``"GPU"`` and ``"CPU"`` too), any other name is a Dask worker resource
    (only workers started with ``--resources NAME=n`` take the trial). A
    ``PlacementGroupFactory`` needs its bundles' sum.

    Raises:
        ConfigError: ``resources`` is neither a mapping nor a ``PlacementGroupFactory`` (a
            function of the config), asks for more than one GPU (use a ``TorchTrainer`` with
            ``num_workers`` ranks), or names ``memory`` (Dask bounds a worker's memory:
            ``dask worker --memory-limit``).
    """
    if isinstance(resources, PlacementGroupFactory):
        resources = resources.required_resources
    if not isinstance(resources, Mapping):
        raise ConfigError(
            f"tune.with_resources(resources={resources!r}) must be a dict such as "
            '{"cpu": 2, "gpu": 1} or a tune.PlacementGroupFactory: a function of the config '
            "has no Dask counterpart (every trial runs on a worker that has what it needs)."
        )
    named = {_RAY_NAMES.get(name, name): amount for name, amount in resources.items()}
    return TrainableWithResources(trainable, named)


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
