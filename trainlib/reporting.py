"""report(), get_checkpoint() and get_all_reported_checkpoints(): what a training function
tells the driver and resumes from."""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trainlib._internal.common import wire
from trainlib._internal.rank.process_globals import current_session
from trainlib._internal.rank.report_sender import reported_checkpoints, send_report
from trainlib.checkpoint import Checkpoint
from trainlib.preemption import PreemptionInfo
from trainlib.validation import (
    CheckpointConsistencyMode,
    ReportedCheckpointStatus,
    ValidationTaskConfig,
)

_DEFAULT_DIR_NAME = re.compile(r"checkpoint_\d{6,}$")


class CheckpointUploadMode(str, enum.Enum):
    """How ``report()`` uploads a checkpoint (Ray's ``ray.train.CheckpointUploadMode``).

    Members:
        SYNC: Upload before ``report()`` returns.
        ASYNC: Hand the files over and return; a background thread uploads them.
    """

    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class ReportedCheckpoint:
    """A committed checkpoint of this run and the metrics reported with it.

    Attributes:
        checkpoint: The committed checkpoint.
        metrics: Rank 0's metrics of the report that saved it, with its validation's.
        status: Whether it is validated, waiting for validation, or only committed.
    """

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED


def report(
    metrics: Mapping[str, Any] | None = None,
    checkpoint: Checkpoint | None = None,
    *,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode | Literal["sync", "async"] = "sync",
    delete_local_checkpoint_after_upload: bool | None = None,
    validation: bool | ValidationTaskConfig = False,
    **named_metrics: Any,
) -> None:
    """Report metrics, and optionally a checkpoint, from every rank.

    Every rank must call ``report`` the same number of times. Rank 0's metrics are kept. The
    files every rank reports with the same call are merged into one checkpoint directory,
    committed by the driver once every rank's files are uploaded.

    Args:
        metrics: Picklable values keyed by name, e.g. ``{"loss": 0.3, "epoch": 2}``.
        checkpoint: A checkpoint to save with this report, usually ``Checkpoint.from_directory``.
        checkpoint_dir_name: The checkpoint's directory name in the run folder (default
            ``checkpoint_{index:06d}``); unique within the run, the same on every rank.
        checkpoint_upload_mode: ``"sync"`` uploads before returning. ``"async"`` copies the
            files into a staging directory (moves them, when they are deleted afterwards) and
            returns; a background thread uploads them. At most one upload runs at a time: the
            next report with a checkpoint waits for it.
        delete_local_checkpoint_after_upload: Delete the local checkpoint directory once its
            files are handed over. ``None``: True with ``"async"``, False with ``"sync"``.
        validation: Validate this report's checkpoint with the trainer's
            ``ValidationConfig`` once it is committed, while training goes on: True with its
            default arguments, a ``ValidationTaskConfig`` with some of them overridden. One
            rank asking is enough (Ray's guide asks on rank 0).
        named_metrics: Metrics as keywords, Ray Tune 1.x's form (``tune.report(loss=0.3)``),
            added to ``metrics``.

    Raises:
        RuntimeError: Called outside a training function.
        TypeError: ``metrics`` is not a mapping with string keys.
        ValueError: An unknown upload mode, a directory name that is not one plain name, or
            ``validation`` without a checkpoint to validate.
        CheckpointError: The storage refused the upload, or an earlier async upload failed.
    """
    session = current_session("report()")
    if named_metrics and (metrics is None or isinstance(metrics, Mapping)):
        metrics = {**(metrics or {}), **named_metrics}
    if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
        raise TypeError(f"report() needs a dict of metrics keyed by str, got {metrics!r}.")
    mode = _mode(checkpoint_upload_mode)
    name = _dir_name(checkpoint_dir_name)
    validate = _validation(validation, checkpoint)
    delete = mode is CheckpointUploadMode.ASYNC
    if delete_local_checkpoint_after_upload is not None:
        delete = delete_local_checkpoint_after_upload
    send_report(
        session,
        metrics,
        checkpoint,
        name,
        upload_async=mode is CheckpointUploadMode.ASYNC,
        delete_local=delete,
        validation=validate,
    )


def get_preemption_info() -> PreemptionInfo | None:
    """Which ranks are about to lose their Dask worker, or None (Ray Train's).

    Not None once the driver has seen a worker of this run retire gracefully (see
    ``FailureConfig.max_preemption_failures``): save a checkpoint now if there is time. When
    the worker is gone the run restarts from its latest checkpoint. Dask gives no deadline,
    and a worker without data leaves at once, so the notice may come too late to act on.
    """
    return current_session("get_preemption_info()").preemption


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint of this run when this attempt started, or None.

    After a restart (``FailureConfig``) or when a run name is re-used, resume from it.
    """
    return current_session("get_checkpoint()").spec.latest_checkpoint


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode | str = CheckpointConsistencyMode.VALIDATED,
    *,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """The run's committed checkpoints with their metrics, oldest first, on any rank.

    Waits until this rank's own uploads have finished and the driver has processed every
    report made so far (so a checkpoint reported by another rank at the same call is in).
    Checkpoints deleted by ``CheckpointConfig(num_to_keep=...)`` are not.

    Args:
        consistency_mode: ``VALIDATED`` (default) also waits for the validations those
            reports asked for, so their metrics are in; ``COMMITTED`` does not.
        timeout_s: Give up after this many seconds (``None``: wait as long as it takes).

    Raises:
        RuntimeError: Called outside a training function.
        TimeoutError: No answer within ``timeout_s``.
        CheckpointError: An async upload of this rank failed.
    """
    session = current_session("get_all_reported_checkpoints()")
    try:
        validated = (
            CheckpointConsistencyMode(consistency_mode) is CheckpointConsistencyMode.VALIDATED
        )
    except ValueError:
        raise ValueError(
            f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}) must be "
            "CheckpointConsistencyMode.COMMITTED or .VALIDATED."
        ) from None
    answer = reported_checkpoints(session, validated, timeout_s)
    return [ReportedCheckpoint(*reported) for reported in answer]


def _validation(
    validation: bool | ValidationTaskConfig, checkpoint: Checkpoint | None
) -> dict[str, Any] | None:
    """The validation's keyword-argument overrides a report asks for (None: no validation)."""
    if validation is False:
        return None
    if validation is not True and not isinstance(validation, ValidationTaskConfig):
        raise TypeError(
            f"report(validation={validation!r}) must be True, False or a "
            "trainlib.ValidationTaskConfig."
        )
    if checkpoint is None:
        raise ValueError(
            "report(validation=...) validates the report's checkpoint, and this report has "
            "none: pass checkpoint= as well, or validation=False."
        )
    if not isinstance(validation, ValidationTaskConfig):
        return {}
    where = "report(validation=ValidationTaskConfig(fn_kwargs))"
    kwargs: dict[str, Any] = wire.plain(validation.fn_kwargs, where=where, strict=True)
    return kwargs


def _mode(value: CheckpointUploadMode | str) -> CheckpointUploadMode:
    try:
        return CheckpointUploadMode(value.lower() if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(
            f"report(checkpoint_upload_mode={value!r}) must be 'sync' or 'async' "
            "(or trainlib.CheckpointUploadMode.SYNC / ASYNC)."
        ) from None


def _dir_name(name: str | None) -> str | None:
    if name is None:
        return None
    plain = isinstance(name, str) and name not in ("", ".", "..") and os.sep not in name
    if not plain or name.startswith(".") or "/" in name or _DEFAULT_DIR_NAME.match(name):
        raise ValueError(
            f"report(checkpoint_dir_name={name!r}) must be one plain directory name, not "
            "starting with '.' nor of the form checkpoint_NNNNNN (trainlib's own names)."
        )
    return name
