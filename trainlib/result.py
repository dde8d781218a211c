"""Result: what ``TorchTrainer.fit()`` returns (defined with the engine that builds it,
``trainlib/_internal/common/result.py``)."""

from trainlib._internal.common.result import Result

__all__ = ["Result"]
