"""Checkpoint validation, as Ray Train's: ``report(..., validation=True)`` has the driver run
``ValidationConfig.fn`` on the committed checkpoint as a Dask task while training goes on, and
the metrics it returns are added to that checkpoint's (a key in both takes the validation's).

Defined below the engine (the driver imports these types), so this module imports only
``trainlib.errors``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import cloudpickle

from trainlib.errors import ConfigError


class ValidationFn(Protocol):
    """A function that validates a checkpoint: ``fn(checkpoint, **fn_kwargs) -> dict``
    (the checkpoint is a ``trainlib.Checkpoint``)."""

    def __call__(self, checkpoint: Any, /, **kwargs: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ValidationTaskConfig:
    """One validation's keyword arguments, given to ``report(validation=...)``.

    Args:
        fn_kwargs: Passed to the validation function after the checkpoint; they override the
            ``ValidationConfig``'s ``task_config`` key by key. Picklable values (Ray asks for
            JSON-serialisable ones; those are).
    """

    fn_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            object.__setattr__(self, "fn_kwargs", {})
        if not isinstance(self.fn_kwargs, Mapping) or not all(
            isinstance(key, str) for key in self.fn_kwargs
        ):
            raise ConfigError(
                f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}) must be a dict keyed by "
                "the validation function's argument names."
            )


@dataclass(frozen=True)
class ValidationConfig:
    """How a trainer validates the checkpoints reported with ``validation=``.

    The function runs as one Dask task on the run's cluster, one validation at a time in
    report order, on a checkpoint already committed (read it with ``checkpoint.as_directory()``
    or ``to_directory()``). Its metrics are merged into the checkpoint's: ``Result``'s
    ``best_checkpoints`` (and ``checkpoint_score_attribute``) and the commit marker see them.
    A checkpoint waiting for validation is never deleted by ``num_to_keep``. ``fit()`` returns
    once every validation has finished. A validation that raises is logged as an error and
    the checkpoint keeps its reported metrics; the run goes on. One still waiting when the run
    stops is run by the next run of the same name (the commit marker records it).

    Args:
        fn: ``fn(checkpoint, **fn_kwargs) -> dict`` of metrics.
        task_config: The default keyword arguments of every validation.
        ray_remote_kwargs: Ray's task options; not supported (there are no Ray tasks): use
            ``submit_kwargs``.
        submit_kwargs: Passed to ``distributed.Client.submit`` to place the task, e.g.
            ``{"resources": {"GPU": 1}}`` (workers started with that resource) or
            ``{"workers": [...]}``.

    Raises:
        ConfigError: ``fn`` is not callable or cannot be pickled, or ``ray_remote_kwargs``
            was given.
    """

    fn: ValidationFn
    task_config: ValidationTaskConfig | None = None
    ray_remote_kwargs: dict[str, Any] | None = None
    submit_kwargs: dict[str, Any] = field(default_factory=dict, kw_only=True)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"ValidationConfig(fn={self.fn!r}) must be a function.")
        try:  # checked now: a Dask task carries it to a worker in the middle of the run
            cloudpickle.dumps(self.fn)
        except Exception as exc:
            name = getattr(self.fn, "__name__", repr(self.fn))
            raise ConfigError(
                f"ValidationConfig(fn={name}) cannot be sent to the Dask workers ({exc}); "
                "keep what it uses picklable, or create it inside the function."
            ) from exc
        if self.ray_remote_kwargs is not None:
            raise ConfigError(
                "ValidationConfig(ray_remote_kwargs=...) configures a Ray task; here the "
                "validation is a Dask task: pass Client.submit's options as submit_kwargs= "
                "(e.g. {'resources': {'GPU': 1}} or {'workers': [...]})."
            )


class CheckpointConsistencyMode(str, enum.Enum):
    """What ``get_all_reported_checkpoints`` waits for (Ray's enum).

    Members:
        COMMITTED: Every report made so far is processed and its checkpoint committed.
        VALIDATED: Also every validation those reports asked for has ended (the default).
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(str, enum.Enum):
    """Where a reported checkpoint stands (``ReportedCheckpoint.status``).

    Members:
        COMMITTED: Committed; no validation asked for, or it failed.
        PENDING_VALIDATION: Committed; its validation has not ended yet.
        VALIDATED: Committed and validated; its metrics include the validation's.
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
