"""The run's own callbacks (``RunConfig.callbacks``: trackers, the system metrics of the ranks'
hosts) on the controller's lifecycle, as Ray Train v2's ``UserCallbackHandler``: told once that
the run starts, when its first group's workers are chosen, then each group's start, failure
and end.
Reports reach them through the report collector, the run's end through the run record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trainlib._internal.driver.controller_callbacks import ControllerCallback

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.failure_policy import FailureDecision
    from trainlib._internal.driver.ranks import WorkerSlot
    from trainlib.callbacks import Callback, GroupInfo


class UserCallbacks(ControllerCallback):
    def __init__(self, callbacks: Sequence[Callback], start: Callable[[int], None]) -> None:
        self._callbacks = callbacks
        self._start = start  # the run record's start_callbacks: on_start once, with the ranks

    def before_worker_group_start(self, client: Client | None, slots: list[WorkerSlot]) -> None:
        self._start(len(slots))

    def after_worker_group_start(self, group: GroupInfo) -> None:
        for callback in self._callbacks:
            callback.on_group_start(group)

    def after_worker_group_failure(self, decision: FailureDecision) -> None:
        for callback in self._callbacks:
            callback.on_failure(decision.error, decision.restart)

    def before_worker_group_shutdown(self, group: GroupInfo) -> None:
        for callback in self._callbacks:
            callback.on_group_end(group)
