"""A run whose split dataset has fewer rows than ranks fails before any rank starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from distributed import Client

from trainlib._internal.driver.controller_callbacks import ControllerCallback

if TYPE_CHECKING:
    from trainlib._internal.common.datasets import DatasetSource
    from trainlib._internal.driver.ranks import WorkerSlot


class DatasetCheck(ControllerCallback):
    def __init__(self, datasets: Sequence[DatasetSource]) -> None:
        self._datasets = datasets

    def before_worker_group_start(self, client: Client | None, slots: list[WorkerSlot]) -> None:
        if client is None:  # local mode: one rank, reading the datasets here
            return
        from trainlib._internal.common.datasets import check_rows

        for source in self._datasets:
            check_rows(source, len(slots), client)
