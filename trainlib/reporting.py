"""report() and get_checkpoint(): what a training function tells the driver and resumes from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainlib._internal.messages import ReportMessage
from trainlib._internal.session import current_session
from trainlib.checkpoint import Checkpoint


def report(metrics: Mapping[str, Any], checkpoint: Checkpoint | None = None) -> None:
    """Report metrics, and optionally a checkpoint, from every rank.

    Every rank must call ``report`` the same number of times. Rank 0's metrics are kept. The
    files of ``checkpoint`` (from any rank) are uploaded before this returns, so the directory
    may be deleted afterwards; the driver commits the checkpoint once every rank has reported.

    Args:
        metrics: Picklable values keyed by name, e.g. ``{"loss": 0.3, "epoch": 2}``.
        checkpoint: A checkpoint to save with this report, usually ``Checkpoint.from_directory``.

    Raises:
        RuntimeError: Called outside a training function.
        TypeError: ``metrics`` is not a mapping with string keys.
    """
    session = current_session("report()")
    if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
        raise TypeError(f"report() needs a dict of metrics keyed by str, got {metrics!r}.")
    index = session.next_index
    session.next_index += 1
    files = session.spec.storage.upload(checkpoint, index) if checkpoint is not None else None
    own_metrics = dict(metrics) if session.spec.world_rank == 0 else None
    session.send("report", ReportMessage(session.spec.world_rank, index, own_metrics, files))


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint of this run when this attempt started, or None.

    After a restart (``FailureConfig``) or when a run name is re-used, resume from it.
    """
    return current_session("get_checkpoint()").spec.latest_checkpoint
