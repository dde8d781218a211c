"""Checkpoint: a directory on some fsspec filesystem (defined with the engine that commits
it, ``trainlib/_internal/common/checkpoint.py``)."""

from trainlib._internal.common.checkpoint import Checkpoint

__all__ = ["Checkpoint"]
