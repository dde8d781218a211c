"""A search trial's run: the workers whose ranks did not stop when told are withheld from its
lease (``tune/worker_leases.py``), so no later trial is placed on them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainlib._internal.driver.controller_callbacks import ControllerCallback

if TYPE_CHECKING:
    from trainlib._internal.driver.placement import Group
    from trainlib._internal.driver.run_plan import WorkerLease


class LeaseWithholding(ControllerCallback):
    def __init__(self, lease: WorkerLease) -> None:
        self._lease = lease

    def after_worker_group_shutdown(self, group: Group) -> None:
        self._lease.withhold(group.unresponsive_workers)
