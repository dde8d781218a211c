"""The concerns of a run that ride on the controller's lifecycle, one module each, as Ray
Train v2's controller and worker-group callbacks do: the worker plugins a cluster needs
(``worker_plugins``), the validations of committed checkpoints (``checkpoint_validation``), the
rows-per-rank check of the datasets (``dataset_check``), a search trial's workers withheld
after they stopped answering (``lease_withholding``), the run's own callbacks: trackers and
system metrics (``user_callbacks``). The controller calls every hook of every callback in
order. GPU claims are not a callback: placement takes them (``gpu_claims``); nor are
preemptions: the failure policy counts them apart (``failure_policy``), and the grace the
surviving ranks get is the worker group's (``preemption_grace``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.controller_state import ControllerState
    from trainlib._internal.driver.failure_policy import FailureDecision
    from trainlib._internal.driver.placement import Group
    from trainlib._internal.driver.ranks import WorkerSlot
    from trainlib.callbacks import GroupInfo


class ControllerCallback:
    """Hooks of the controller's lifecycle; each does nothing unless overridden."""

    def after_controller_start(self, client: Client | None) -> None:
        """Connected to the cluster (None: local mode), before the first attempt."""

    def after_controller_state_update(
        self, previous: ControllerState, current: ControllerState
    ) -> None:
        """The run left ``previous`` for ``current`` (``controller_state``)."""

    def before_worker_group_start(self, client: Client | None, slots: list[WorkerSlot]) -> None:
        """An attempt's workers are chosen (on no cluster: local mode); raise to fail the run
        before any rank starts."""

    def after_worker_group_start(self, group: GroupInfo) -> None:
        """An attempt's ranks are started."""

    def after_worker_group_failure(self, decision: FailureDecision) -> None:
        """An attempt's ranks failed; ``decision``: its failures, and whether the run restarts
        (else it raises them)."""

    def before_worker_group_shutdown(self, group: GroupInfo) -> None:
        """An attempt's ranks are about to be stopped (whatever ended it)."""

    def after_worker_group_shutdown(self, group: Group) -> None:
        """An attempt's ranks were stopped (whatever ended it)."""

    def after_run_trained(self) -> None:
        """The last attempt succeeded: every rank ended well."""

    def before_controller_shutdown(self) -> None:
        """The run ends, however: release what ``after_controller_start`` took."""
