"""PyTorchTrainable: a PyTorchTrainer behind Tune's class-trainable interface."""

from __future__ import annotations

import os
from typing import Any

from trainlib.sgd.trainer import PyTorchTrainer


class PyTorchTrainable:
    """One trial: ``config`` holds ``PyTorchTrainer``'s arguments; a step is one training
    pass followed by one validation pass.

    As RaySGD's ``PyTorchTrainable``: pass the trainer's arguments (creators, ``config``,
    ``num_replicas``, ...) as the trial's config, e.g.
    ``tune.run(PyTorchTrainable, config={"model_creator": ..., "config": {"lr":
    tune.loguniform(1e-4, 1e-1)}, "num_replicas": 2})``. Methods follow Ray Tune's class API:
    ``setup``, ``step``, ``save_checkpoint``, ``load_checkpoint``, ``cleanup``.

    Args:
        config: Keyword arguments of ``PyTorchTrainer``.

    Example:
        >>> trainable = PyTorchTrainable({"model_creator": ..., "data_creator": ...,
        ...                               "optimizer_creator": ..., "loss_creator": nn.MSELoss})
        >>> trainable.step()["validation_loss"]
        >>> trainable.cleanup()
    """

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
