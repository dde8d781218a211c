"""What a Tuner runs: its trainable (a TorchTrainer, a function of config, or a class with
``as_torch_trainer``) as one TorchTrainer whose ``train_loop_config`` each trial sets."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainlib.config import RunConfig, ScalingConfig, Searched
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError
from trainlib.torch.trainer import TorchTrainer
from trainlib.tune.class_api import ClassTrial, Trainable
from trainlib.tune.resources import TrainableWithResources

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.run_plan import RunPlan


def check_not_local(num_workers: int) -> None:
    """Raises ``ConfigError`` for a trainer in local mode: a search's trials need a cluster."""
    if num_workers == 0:
        raise ConfigError(
            "Tuner(TorchTrainer(scaling_config=ScalingConfig(num_workers=0))): local mode runs "
            "one run in this process; a search runs its trials on a Dask cluster: give "
            "num_workers=1 or more."
        )


def check_trainer_space(param_space: Mapping[str, Any]) -> None:
    unknown = sorted(set(param_space) - {"train_loop_config", "scaling_config"})
    if unknown:
        raise ConfigError(
            f"param_space keys {unknown} cannot be tuned for a TorchTrainer; put the "
            "hyperparameters under param_space['train_loop_config'] (and trial sizes under "
            "param_space['scaling_config'])."
        )
    scaling = param_space.get("scaling_config")
    if scaling is not None and not isinstance(scaling, ScalingConfig):
        raise ConfigError(
            f"param_space['scaling_config']={scaling!r} must be a ScalingConfig, e.g. "
            "ScalingConfig(num_workers=tune.grid_search([1, 2]))."
        )
    if scaling is not None and scaling.num_workers == 0:
        raise ConfigError(
            "param_space['scaling_config'] with num_workers=0 (local mode) cannot be searched: "
            "a search runs its trials on a Dask cluster."
        )


def trial_sizes(scaling: ScalingConfig) -> list[int]:
    """The ``num_workers`` a searched ScalingConfig may give a trial (the largest decides the
    size of a cluster the Tuner starts)."""
    from trainlib.tune.search_space import Categorical, GridSearch, Integer

    searched = scaling.num_workers
    if isinstance(searched, (GridSearch, Categorical)):
        values = list(searched.values)
    elif isinstance(searched, Integer):
        values = [searched.low, searched.high - 1]
    elif isinstance(searched, Searched):
        raise ConfigError(
            f"ScalingConfig(num_workers={searched!r}): search trial sizes with "
            "tune.grid_search, tune.choice or tune.randint."
        )
    else:
        return [scaling.worker_range[1]]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ConfigError(
            f"ScalingConfig(num_workers={searched!r}) must search whole numbers >= 1."
        )
    return values


def as_trainer(
    trainable: Any,
    param_space: Mapping[str, Any],
    run_config: RunConfig | None,
    dask_config: DaskConfig | None,
    client: Client | None,
) -> TorchTrainer:
    if isinstance(trainable, TorchTrainer):
        if dask_config is not None or client is not None:
            trainable = trainable.on_cluster(dask_config, client)
        return trainable
    if isinstance(trainable, type) and issubclass(trainable, Trainable):
        checkpoints = (run_config or RunConfig()).checkpoint_config
        trainable = ClassTrial(trainable, checkpoints)
    elif isinstance(trainable, type) and hasattr(trainable, "as_torch_trainer"):
        trainer: TorchTrainer = trainable.as_torch_trainer(
            param_space, run_config, dask_config, client
        )
        return trainer
    if isinstance(trainable, type):
        raise ConfigError(
            f"Tuner(trainable={trainable.__name__}): a trainable class subclasses "
            "trainlib.tune.Trainable (or has an as_torch_trainer classmethod, as "
            "trainlib.sgd.PyTorchTrainable); or write the trial as a function of config that "
            "calls trainlib.report."
        )
    if not callable(trainable):
        raise ConfigError(
            f"Tuner(trainable={trainable!r}) must be a TorchTrainer or a function of config."
        )
    scaling = (
        trainable.scaling
        if isinstance(trainable, TrainableWithResources)
        else ScalingConfig(num_workers=1)
    )
    trainer = TorchTrainer(
        ReturnedResult(trainable),
        train_loop_config={},
        scaling_config=scaling,
        run_config=run_config,
        dask_config=dask_config,
        client=client,
    )
    return trainer


class ReturnedResult:
    """A function trainable whose returned dict is reported as its last result, as Ray's
    function API does (``return {"score": final_score}``)."""

    def __init__(self, trainable: Callable[..., Any]) -> None:
        functools.update_wrapper(self, trainable)  # first: it copies the wrapped's attributes
        self.trainable = trainable

    def __call__(self, *config: dict[str, Any]) -> Any:
        returned = self.trainable(*config)  # config, if the function takes one
        if isinstance(returned, Mapping):
            from trainlib.reporting import report  # in the trial's rank

            report(dict(returned))
        return returned


def sized(config: dict[str, Any], sizes: ScalingConfig | None) -> dict[str, Any]:
    """A trial's ``config`` with ``param_space["scaling_config"]`` (``sizes``; None: the
    trainer's own) as its ScalingConfig, the values sampled for it filled in."""
    if sizes is None:
        return config
    sampled = config.get("scaling_config", {})
    resources = {**(sizes.resources_per_worker or {}), **sampled.get("resources_per_worker", {})}
    config["scaling_config"] = replace(
        sizes,
        num_workers=sampled.get("num_workers", sizes.num_workers),
        resources_per_worker=resources or None,
    )
    return config


def trial_plan(
    trainer: TorchTrainer, run_config: RunConfig, is_function: bool, config: dict[str, Any]
) -> RunPlan:
    """The run of a trial of ``config``: the trainer's, with the search's ``run_config`` (its
    stop conditions left to the search) and the trial's ScalingConfig if it has its own."""
    train_loop_config = config if is_function else config.get("train_loop_config", {})
    plan = replace(trainer._plan(train_loop_config), run_config=replace(run_config, stop=None))
    sizes = None if is_function else config.get("scaling_config")
    return plan if sizes is None else replace(plan, scaling=sizes)
