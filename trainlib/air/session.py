"""Ray AIR's ``session``: the rank's place in the group, ``report`` and ``get_checkpoint``.

Each function is the ``trainlib`` call of the same meaning (``get_context()``, ``report``,
``get_checkpoint``, ``get_dataset_shard``); all raise ``RuntimeError`` outside a training
function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainlib import reporting
from trainlib.checkpoint import Checkpoint
from trainlib.context import get_context
from trainlib.data import DataIterator
from trainlib.data import get_dataset_shard as _get_dataset_shard

__all__ = [
    "get_checkpoint",
    "get_dataset_shard",
    "get_experiment_name",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_world_rank",
    "get_world_size",
    "report",
]


def get_world_size() -> int:
    """Number of ranks in the group."""
    return get_context().get_world_size()


def get_world_rank() -> int:
    """This rank's global index, 0 to world_size - 1."""
    return get_context().get_world_rank()


def get_local_rank() -> int:
    """This rank's index among the ranks on its host."""
    return get_context().get_local_rank()


def get_local_world_size() -> int:
    """Number of ranks on this rank's host."""
    return get_context().get_local_world_size()


def get_node_rank() -> int:
    """Index of this rank's host among the group's hosts."""
    return get_context().get_node_rank()


def get_experiment_name() -> str:
    """The run name (``RunConfig.name``)."""
    return get_context().get_experiment_name()


def report(metrics: Mapping[str, Any], *, checkpoint: Checkpoint | None = None) -> None:
    """Report metrics, and optionally a checkpoint, from every rank (``trainlib.report``)."""
    reporting.report(metrics, checkpoint=checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from, or None (``trainlib.get_checkpoint``)."""
    return reporting.get_checkpoint()


def get_dataset_shard(name: str) -> DataIterator:
    """This rank's share of dataset ``name`` (``trainlib.get_dataset_shard``)."""
    return _get_dataset_shard(name)
