"""``ray.train.v2.api.preemption``."""

from trainlib.preemption import PreemptionInfo

__all__ = ["PreemptionInfo"]
