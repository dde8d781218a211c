"""Ray AIR's names, for code written against ``ray.air`` (Ray 2.0 to 2.6).

Port by changing imports: ``ray.air`` -> ``trainlib.air``, ``ray.train`` -> ``trainlib``
(``from ray import train`` -> ``import trainlib as train``). ``session`` is the module of
per-rank calls (``session.get_world_size()``, ``session.report(...)``); the configs and
``Checkpoint`` are trainlib's own.
"""

from trainlib.air import session
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.result import Result

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "session",
]
