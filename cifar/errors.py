"""The errors the train-cifar pipeline explains to its users: the tree's root, and those the
CIFAR domain raises. Each layer above documents its own, in its package's docstring, and
defines each where it is raised.

::

    PipelineError                 str(error) is the whole message: what failed, why, what to do
    ├── InvalidParameterError     a flow parameter cannot work (an unknown model)  (ValueError)
    ├── NotCifarArchiveError      not a CIFAR-10 python archive, or truncated  (also a ValueError)
    ├── UnsafeArchiveError        a member could escape the target or fill the disk (ValueError)
    ├── CorruptDataError          a dataset file does not match its sha256  (also a ValueError)
    ├── TrainingDivergedError     the loss became NaN or infinite
    └── preparation.DatasetTooSmallError  too few images for the ranks and batch size (ValueError)
"""

from __future__ import annotations


class PipelineError(Exception):
    """An error whose message tells the user what failed, the cause and what to do."""


class InvalidParameterError(PipelineError, ValueError):
    """A parameter of the pipeline has a value it cannot work with."""


class NotCifarArchiveError(PipelineError, ValueError):
    """A file is not a CIFAR-10 python archive (or is truncated)."""


class UnsafeArchiveError(PipelineError, ValueError):
    """The archive has a member that could escape the target directory or exhaust the disk."""


class CorruptDataError(PipelineError, ValueError):
    """A dataset file does not match its sha256 in the manifest."""


class TrainingDivergedError(PipelineError):
    """The training loss became NaN or infinite."""
