"""PyTorchTrainable: a PyTorchTrainer behind Tune's class-trainable interface."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainlib.config import RunConfig
from trainlib.dask_config import DaskConfig
from trainlib.errors import ConfigError
from trainlib.sgd import _runner
from trainlib.sgd._setup import runner_setup, scaling
from trainlib.sgd.trainer import PyTorchTrainer
from trainlib.torch.trainer import TorchTrainer

if TYPE_CHECKING:
    from distributed import Client

# PyTorchTrainer's arguments that shape the trial's ranks: fixed for the whole search
_GROUP_KEYS = ("num_replicas", "use_gpu", "initialization_hook")
_CLUSTER_KEYS = ("run_config", "dask_config", "client")


class PyTorchTrainable:
    """One trial: ``config`` holds ``PyTorchTrainer``'s arguments; a step is one training
    pass followed by one validation pass.

    As RaySGD's ``PyTorchTrainable``: pass the trainer's arguments (creators, ``config``,
    ``num_replicas``, ...) as the trial's config, e.g.
    ``tune.run(PyTorchTrainable, config={"model_creator": ..., "config": {"lr":
    tune.loguniform(1e-4, 1e-1)}, "num_replicas": 2})``. Methods follow Ray Tune's class API:
    ``setup``, ``step``, ``save_checkpoint``, ``load_checkpoint``, ``cleanup``.

    In a ``Tuner`` (or ``tune.run``) each trial is one trainlib run of ``num_replicas`` ranks
    (``as_torch_trainer``): every step is reported with the state as a checkpoint, so an
    interrupted trial resumes from its last step; bound the steps with
    ``stop={"training_iteration": N}`` or the scheduler's ``max_t``.

    Args:
        config: Keyword arguments of ``PyTorchTrainer``.

    Example:
        >>> trainable = PyTorchTrainable({"model_creator": ..., "data_creator": ...,
        ...                               "optimizer_creator": ..., "loss_creator": nn.MSELoss})
        >>> trainable.step()["validation_loss"]
        >>> trainable.cleanup()
    """

    @classmethod
    def as_torch_trainer(
        cls,
        param_space: Mapping[str, Any],
        run_config: RunConfig | None = None,
        dask_config: DaskConfig | None = None,
        client: Client | None = None,
    ) -> TorchTrainer:
        """The TorchTrainer a Tuner runs for each trial: its ``train_loop_config`` is the
        trial's config (PyTorchTrainer's arguments, sampled from ``param_space``).

        Raises:
            ConfigError: ``num_replicas``, ``use_gpu`` or ``initialization_hook`` is a search
                space (the ranks of every trial are alike), or a cluster argument is given
                in the config instead of to the Tuner.
        """
        from trainlib.tune.search_space import Domain, GridSearch

        known = {*inspect.signature(runner_setup).parameters, *_GROUP_KEYS}
        unknown = sorted(set(param_space) - known - set(_CLUSTER_KEYS))
        if unknown:
            raise ConfigError(
                f"PyTorchTrainable's config has {unknown}, which are not PyTorchTrainer "
                f"arguments it takes per trial; use {sorted(known)}."
            )
        for key in _GROUP_KEYS:
            if isinstance(param_space.get(key), (Domain, GridSearch)):
                raise ConfigError(
                    f"PyTorchTrainable cannot tune {key!r}: give it one value for every trial."
                )
        for key in _CLUSTER_KEYS:
            if key in param_space:
                raise ConfigError(
                    f"PyTorchTrainable's config cannot hold {key!r}: give {key}= to the "
                    "Tuner instead."
                )
        return TorchTrainer(
            _step_forever,
            train_loop_config={},
            scaling_config=scaling(
                param_space.get("num_replicas", 1),
                param_space.get("use_gpu", False),
                param_space.get("initialization_hook"),
            ),
            run_config=run_config,
            dask_config=dask_config,
            client=client,
        )

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.trainer: PyTorchTrainer | None = None
        self.setup(self.config)

    def setup(self, config: dict[str, Any]) -> None:
        """Start the trial's trainer (its ranks)."""
        self.trainer = PyTorchTrainer(**config)

    def step(self) -> dict[str, Any]:
        """One training pass and one validation pass: their metrics merged."""
        trainer = self._trainer()
        stats = trainer.train()
        stats.update(trainer.validate())
        return stats

    def save_checkpoint(self, checkpoint_dir: str) -> str:
        """Save the trainer's state into ``checkpoint_dir``; returns the file's path."""
        return self._trainer().save(os.path.join(checkpoint_dir, "model.pth"))

    def load_checkpoint(self, checkpoint_path: str) -> None:
        """Restore a state written by ``save_checkpoint``."""
        self._trainer().restore(checkpoint_path)

    def cleanup(self) -> None:
        """Stop the trainer's ranks."""
        if self.trainer is not None:
            self.trainer.shutdown()

    def _trainer(self) -> PyTorchTrainer:
        if self.trainer is None:
            raise RuntimeError("PyTorchTrainable.setup() has not run.")
        return self.trainer


def _step_forever(trial_config: dict[str, Any]) -> None:
    """Each rank of a PyTorchTrainable trial (see ``_runner.step_forever``)."""
    arguments = {k: v for k, v in trial_config.items() if k not in _GROUP_KEYS}
    setup = runner_setup(**arguments, num_replicas=trial_config.get("num_replicas", 1))
    _runner.step_forever(setup)
