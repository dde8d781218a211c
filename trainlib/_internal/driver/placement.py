"""Where an attempt's ranks run: the workers chosen (``worker_selection``) and the group of
ranks started on them (``worker_group``). The controller asks a ``Placement``; tests give it
one whose groups replay a script."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from trainlib._internal.driver.group_status import GroupStatus
from trainlib._internal.driver.ranks import WorkerSlot

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.common.messages import ToRank
    from trainlib._internal.driver.gpu_claims import GpuClaims
    from trainlib._internal.driver.run_plan import RunPlan
    from trainlib._internal.driver.worker_group import LaunchBuilder, MessageHandler
    from trainlib.errors import RankFailure


class Group(Protocol):
    """An attempt's running ranks, as the controller drives them (``WorkerGroup``)."""

    @property
    def size(self) -> int: ...

    @property
    def unresponsive_workers(self) -> set[str]: ...

    def poll(self, timeout_s: float) -> GroupStatus: ...

    def fail(self, failures: dict[int, RankFailure]) -> GroupStatus: ...

    def stop(self) -> GroupStatus: ...

    def send(self, message: ToRank) -> None: ...

    def send_to(self, world_rank: int, message: ToRank) -> None: ...


class Placement(Protocol):
    """Chooses an attempt's workers and starts its ranks on them."""

    def select(
        self,
        client: Client,
        plan: RunPlan,
        unresponsive: frozenset[str],
        poll: Callable[[], None],
        claims: GpuClaims,
    ) -> list[WorkerSlot]: ...

    def start(
        self,
        client: Client,
        slots: list[WorkerSlot],
        build: LaunchBuilder,
        handle: MessageHandler,
        resources: dict[str, float] | None,
    ) -> AbstractContextManager[Group]: ...


class DaskPlacement:
    """Ranks on the Dask workers of the run's cluster, one each."""

    def select(
        self,
        client: Client,
        plan: RunPlan,
        unresponsive: frozenset[str],
        poll: Callable[[], None],
        claims: GpuClaims,
    ) -> list[WorkerSlot]:
        """The workers of the next attempt, avoiding ``unresponsive`` ones; for a search's
        trial, among its lease; for GPUs, claimed in ``claims`` (see ``select_workers``)."""
        from trainlib._internal.driver import worker_selection

        return worker_selection.select_workers(
            client,
            plan.scaling,
            plan.dask_config.worker_timeout_s,
            unresponsive,
            poll=poll,
            allowed=plan.lease.allowed if plan.lease else None,
            claims=claims if plan.scaling.use_gpu else None,
        )

    def start(
        self,
        client: Client,
        slots: list[WorkerSlot],
        build: LaunchBuilder,
        handle: MessageHandler,
        resources: dict[str, float] | None,
    ) -> AbstractContextManager[Group]:
        """One rank per slot, supervised on its worker (``WorkerGroup.start``)."""
        from trainlib._internal.driver.worker_group import WorkerGroup

        return WorkerGroup.start(client, slots, build, handle, resources)
