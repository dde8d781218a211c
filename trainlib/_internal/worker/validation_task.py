"""The Dask task that validates one committed checkpoint (``ValidationConfig.fn``)."""

from __future__ import annotations

from typing import Any

from trainlib.checkpoint import Checkpoint
from trainlib.validation import ValidationFn


def validate_checkpoint(
    fn: ValidationFn, checkpoint: Checkpoint, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """``fn(checkpoint, **kwargs)``, checked to be a dict of metrics keyed by name.

    Raises:
        TypeError: ``fn`` returned something else.
    """
    metrics = fn(checkpoint, **kwargs)
    if not isinstance(metrics, dict) or not all(isinstance(key, str) for key in metrics):
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(
            f"The validation function {name} returned {type(metrics).__name__} "
            f"{metrics!r:.80}; it must return a dict of metrics keyed by name."
        )
    return metrics
