"""Hugging Face Transformers on trainlib's ranks, as Ray's ``ray.train.huggingface.transformers``.

Inside a ``TorchTrainer``'s training function a ``transformers.Trainer`` trains on the run's
ranks: its ``TrainingArguments`` find the process group trainlib formed (``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` are set as torchrun sets them) and shard the data between
the ranks. ``RayTrainReportCallback`` reports the latest logged metrics with a copy of each
checkpoint the Trainer saves (under ``checkpoint/`` of trainlib's checkpoint);
``prepare_trainer`` lets the Trainer read a ``get_dataset_shard(...).iter_torch_batches()``
(which is already this rank's share, in batches) as its training and evaluation data.

Transformers is an optional dependency (``pip install ".[transformers]"``): this module imports
it, the rest of trainlib never does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import transformers
from torch.utils.data import DataLoader, IterableDataset
from transformers.trainer_callback import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from trainlib import reporting
from trainlib.checkpoint import Checkpoint
from trainlib.data.iterator import Passes

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


class RayTrainReportCallback(TrainerCallback):
    """Reports to trainlib each time the Trainer saves a checkpoint, on every rank: the latest
    entry of its ``state.log_history`` as the metrics and, from the first rank (the one the
    Trainer saves on), the checkpoint folder it just wrote, under ``CHECKPOINT_NAME`` (Ray's).
    Align ``save_strategy`` with ``eval_strategy`` (and ``logging_strategy``) so that the
    metrics are those of the saved model."""

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics = dict(state.log_history[-1]) if state.log_history else {}
        if not state.is_world_process_zero:  # it saved nothing: its report only
            reporting.report(metrics)
            return
        source = get_last_checkpoint(args.output_dir)
        with tempfile.TemporaryDirectory() as directory:
            shutil.copytree(source, os.path.join(directory, self.CHECKPOINT_NAME))
            reporting.report(metrics, checkpoint=Checkpoint.from_directory(directory))


class _Batches(IterableDataset[Any]):
    """The batches of an iterable (each already a batch), as a torch dataset."""

    def __init__(self, batches: Iterable[Any]) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def prepare_trainer(trainer: transformers.Trainer) -> transformers.Trainer:
    """The Trainer, reading a ``DataIterator.iter_torch_batches()`` (or ``iter_batches()``)
    given as its ``train_dataset`` or ``eval_dataset`` batch by batch, as it comes (this
    rank's share: the Trainer does not split it again). Give ``TrainingArguments(max_steps=)``
    with such data: its length is unknown. Any other dataset is read as the Trainer reads it."""
    base: type[transformers.Trainer] = type(trainer)

    class TrainlibTransformersTrainer(base):  # type: ignore[valid-type, misc]
        def get_train_dataloader(self) -> DataLoader[Any]:
            if isinstance(self.train_dataset, Passes):
                return _loader(self.train_dataset)
            return super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader[Any]:
            dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            if isinstance(dataset, Passes):
                return _loader(dataset)
            return super().get_eval_dataloader(eval_dataset)

    trainer.__class__ = TrainlibTransformersTrainer
    return trainer


def _loader(batches: Iterable[Any]) -> DataLoader[Any]:
    return DataLoader(_Batches(batches), batch_size=1, collate_fn=_first)


def _first(items: list[Any]) -> Any:
    return items[0]
