"""PyTorch Lightning on trainlib's ranks, as Ray's ``ray.train.lightning``.

Inside a ``TorchTrainer``'s training function, a Lightning ``Trainer`` given
``strategy=RayDDPStrategy()`` (or the FSDP or DeepSpeed one) and
``plugins=[RayLightningEnvironment()]`` trains on the run's ranks: the process group is the one
trainlib already formed (Lightning finds it initialised and uses it), the ranks and world size
are the run's, the device is the rank's (``trainlib.torch.get_device()``), and Lightning's
distributed sampler splits the data between the ranks. ``RayTrainReportCallback`` reports
``trainer.callback_metrics`` and a Lightning checkpoint (``checkpoint.ckpt``) at the end of
every training epoch; ``prepare_trainer`` checks the trainer is set up so.

Lightning is an optional dependency (``pip install ".[lightning]"``): this module imports it
(``lightning.pytorch`` if installed, else ``pytorch_lightning``, as Ray does), the rest of
trainlib never does.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from trainlib import reporting
from trainlib.checkpoint import Checkpoint
from trainlib.context import get_context
from trainlib.torch.train_loop import get_device

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import LightningEnvironment
except ModuleNotFoundError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef, unused-ignore]
    from pytorch_lightning.plugins.environments import (  # type: ignore[no-redef, attr-defined, unused-ignore]
        LightningEnvironment,
    )

__all__ = [
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]


class _OnTheRanks:
    """What every strategy here changes of Lightning's: the rank's device, and a sampler over
    the run's ranks (the process group and its backend are the run's ``TorchConfig``'s)."""

    world_size: int
    global_rank: int

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_OnTheRanks, pl.strategies.DDPStrategy):  # type: ignore[misc]
    """Lightning's ``DDPStrategy`` on the run's ranks (its arguments; the backend and timeout
    are the run's ``TorchConfig``'s)."""


class RayFSDPStrategy(_OnTheRanks, pl.strategies.FSDPStrategy):  # type: ignore[misc]
    """Lightning's ``FSDPStrategy`` on the run's ranks (its arguments)."""


class RayDeepSpeedStrategy(_OnTheRanks, pl.strategies.DeepSpeedStrategy):  # type: ignore[misc]
    """Lightning's ``DeepSpeedStrategy`` on the run's ranks (DeepSpeed installed)."""


class RayLightningEnvironment(LightningEnvironment):  # type: ignore[misc]
    """The run's ranks as Lightning's cluster environment: world size, global, local and node
    rank from ``trainlib.get_context()``; Lightning cannot change them."""

    def world_size(self) -> int:
        return get_context().get_world_size()

    def global_rank(self) -> int:
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        pass  # the run's

    def set_global_rank(self, rank: int) -> None:
        pass  # the run's

    def teardown(self) -> None:
        pass  # the process group is the run's: trainlib destroys it


_STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check that ``trainer`` runs on the run's ranks: one of the strategies here, with
    ``RayLightningEnvironment`` (or none) as its cluster environment.

    Raises:
        RuntimeError: Another strategy or cluster environment, naming the one to use.
    """
    if not isinstance(trainer.strategy, _STRATEGIES):
        names = ", ".join(strategy.__name__ for strategy in _STRATEGIES)
        raise RuntimeError(
            f"The Lightning Trainer's strategy is a {type(trainer.strategy).__name__}: pass "
            f"strategy=trainlib.lightning.RayDDPStrategy() (or one of {names}) to pl.Trainer."
        )
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            f"The Lightning Trainer's cluster environment is a {type(environment).__name__}: "
            "pass plugins=[trainlib.lightning.RayLightningEnvironment()] to pl.Trainer."
        )
    return trainer


class RayTrainReportCallback(pl.callbacks.Callback):  # type: ignore[misc]
    """At the end of every training epoch, report ``trainer.callback_metrics`` (with
    ``epoch`` and ``step``) and a checkpoint holding Lightning's checkpoint file
    ``CHECKPOINT_NAME`` (reload it with ``YourModule.load_from_checkpoint``)."""

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics: dict[str, Any] = {
            key: value.item() if isinstance(value, torch.Tensor) else value
            for key, value in trainer.callback_metrics.items()
        }
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        with tempfile.TemporaryDirectory() as directory:
            # every rank calls it (a collective); Lightning writes the file on rank 0
            trainer.save_checkpoint(os.path.join(directory, self.CHECKPOINT_NAME))
            reporting.report(metrics, checkpoint=Checkpoint.from_directory(directory))
            trainer.strategy.barrier()  # every rank reported before any directory goes
