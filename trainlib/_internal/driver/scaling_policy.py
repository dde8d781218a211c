"""The scaling policy of an elastic run (Ray Train v2's ``ScalingPolicy``): when a healthy
group of fewer than ``max`` ranks should be re-formed larger (Ray Train's
``elastic_resize_monitor_interval_s``), decided on a poll of the group (``GroupStatus``). A
shrink needs no decision: a preempted or lost worker fails its attempt, and the next one forms
from the workers left."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from distributed import Client

from trainlib._internal.driver import worker_selection
from trainlib._internal.driver.checkpoint_manager import CheckpointManager
from trainlib._internal.driver.group_status import GroupStatus
from trainlib.config import ScalingConfig


@dataclass(frozen=True)
class ResizeDecision:
    """Re-form a group of ``ranks`` ranks larger: ``available`` eligible workers are there,
    for a run of at most ``most`` ranks."""

    ranks: int
    available: int
    most: int


class ScalingPolicy:
    """Asked after each poll of a group: resize once more eligible workers than the group's
    ranks are there and a checkpoint was committed since it formed (re-forming sooner would
    throw that work away). Never for a fixed size, a full group or a group with a failed or
    ended rank. ``eligible`` counts the cluster's eligible workers now; ``clock`` paces the
    looks."""

    def __init__(
        self,
        scaling: ScalingConfig,
        group_size: int,
        checkpointed: Callable[[], bool],
        eligible: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scaling = scaling
        self._group_size = group_size
        self._checkpointed = checkpointed
        self._eligible = eligible
        self._clock = clock
        self._interval_s = scaling.elastic_resize_monitor_interval_s
        self._next = clock() + self._interval_s

    def decide(self, status: GroupStatus) -> ResizeDecision | None:
        """The resize the group of ``status`` needs now, or None."""
        if status.ended or self._group_size >= self._scaling.worker_range[1]:
            return None
        if self._clock() < self._next:
            return None
        self._next = self._clock() + self._interval_s
        if not self._checkpointed():
            return None
        available = self._eligible()
        if available <= self._group_size:
            return None
        return ResizeDecision(self._group_size, available, self._scaling.worker_range[1])


def scaling_policy(
    client: Client, scaling: ScalingConfig, group_size: int, manager: CheckpointManager
) -> ScalingPolicy:
    """The policy of a group of ``group_size`` ranks just formed on ``client``'s cluster: a
    checkpoint committed after the latest one ``manager`` holds now makes it worth re-forming."""
    formed_after = manager.latest
    mark = formed_after.index if formed_after else -1

    def checkpointed() -> bool:
        latest = manager.latest
        return latest is not None and latest.index > mark

    def eligible() -> int:
        found = worker_selection.eligible_workers(
            client, scaling.resources_per_worker, scaling.use_gpu
        )
        return len(found)

    return ScalingPolicy(scaling, group_size, checkpointed, eligible)
