"""How a transform's tasks run (Ray Data's ``ActorPoolStrategy``, accepted for ``compute=``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActorPoolStrategy:
    """Ray Data's ``ActorPoolStrategy(size=, min_size=, max_size=)`` for ``map_batches(compute=)``:
    accepted; a callable class is constructed once per process that runs its tasks."""

    size: int | None = None
    min_size: int | None = None
    max_size: int | None = None
