"""Callbacks: how trackers (MLflow, Prefect) observe a run from the driver.

Subclass ``Callback`` and override what you need; pass instances in
``RunConfig(callbacks=[...])``. Defined with the engine that calls them
(``trainlib/_internal/common/callbacks.py``).
"""

from trainlib._internal.common.callbacks import (
    Callback,
    GroupInfo,
    RankPlacement,
    Report,
    RunInfo,
)

__all__ = ["Callback", "GroupInfo", "RankPlacement", "Report", "RunInfo"]
