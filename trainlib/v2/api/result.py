"""``ray.train.v2.api.result``."""

from trainlib.result import Result

__all__ = ["Result"]
