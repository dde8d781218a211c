"""A rank's side of ``report()`` and ``get_all_reported_checkpoints()`` (``trainlib.reporting``
checks the arguments and calls these): a report's index, its checkpoint's upload (now, or
staged for the background upload), and the ``ReportMessage`` the driver commits it from; the
driver's answer about the committed checkpoints.

The commit itself, once every rank's message is in, is the driver's
(``driver/report_collector.py``, ``common/storage.py``).
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from typing import Any

from trainlib._internal.common import wire
from trainlib._internal.common.messages import CheckpointsQuery, ReportMessage
from trainlib._internal.rank import uploads
from trainlib._internal.rank.session import Session
from trainlib.checkpoint import Checkpoint
from trainlib.errors import CheckpointError
from trainlib.validation import ReportedCheckpointStatus

Answer = list[tuple[Checkpoint, dict[str, Any], ReportedCheckpointStatus]]


def send_report(
    session: Session,
    metrics: Mapping[str, Any],
    checkpoint: Checkpoint | None,
    dir_name: str | None,
    *,
    upload_async: bool,
    delete_local: bool,
    validation: dict[str, Any] | None,
) -> None:
    """Report ``metrics`` (kept from rank 0) and upload ``checkpoint`` under ``dir_name``
    (None: ``checkpoint_{index:06d}``); ``validation``: the validation's keyword arguments.

    Raises:
        CheckpointError: ``dir_name`` is taken, the storage refused the upload, or an earlier
            async upload failed.
    """
    index = session.next_index
    session.next_index += 1
    rank = session.spec.world_rank
    own_metrics = wire.plain(metrics, where="report(metrics)") if rank == 0 else None
    if checkpoint is None:
        session.uploads.send(ReportMessage(rank, index, own_metrics, None))
        return
    session.uploads.wait()  # one upload at a time; raises if the last one failed
    storage = session.spec.storage
    if dir_name is not None and storage.is_committed(storage.checkpoint_dir(index, dir_name)):
        raise CheckpointError(
            f"report(checkpoint_dir_name={dir_name!r}): this run already has a committed "
            f"checkpoint {storage.url(storage.checkpoint_dir(index, dir_name))}; give each "
            "checkpoint a unique name, e.g. with the epoch in it."
        )
    if not upload_async:
        files = storage.upload(checkpoint, index, dir_name)
        if delete_local:
            uploads.delete_local(checkpoint)
        session.uploads.send(ReportMessage(rank, index, own_metrics, files, dir_name, validation))
        return
    staged = uploads.stage(checkpoint, move=delete_local)
    session.uploads.start(
        index,
        staged,
        lambda local: ReportMessage(
            rank,
            index,
            own_metrics,
            session.uploads.upload_in_helper(storage, local, index, dir_name),
            dir_name,
            validation,
        ),
    )


def reported_checkpoints(session: Session, validated: bool, timeout_s: float | None) -> Answer:
    """The run's committed checkpoints, once the driver has processed every report this rank
    made (and, ``validated``, their validations ended).

    Raises:
        TimeoutError: No answer within ``timeout_s``.
        CheckpointError: An async upload of this rank failed.
    """
    session.uploads.send(CheckpointsQuery(session.spec.world_rank, session.next_index, validated))
    session.uploads.wait()
    try:
        answer = session.answers.get(timeout=timeout_s).checkpoints
    except queue.Empty:
        raise TimeoutError(
            f"get_all_reported_checkpoints(timeout_s={timeout_s}) had no answer in time: the "
            "driver processes a report once every rank has made it"
            + (" and, in VALIDATED mode, its validation has ended." if validated else ".")
        ) from None
    return answer
