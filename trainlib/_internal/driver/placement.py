"""Where a run's ranks run: the cluster connected to (``cluster``), the GPUs the run holds
(``gpu_claims``), each attempt's workers (``worker_selection``) and the group of ranks started
on them (``worker_group``). The controller asks a ``Placement``: on a Dask cluster, or here
(``local_mode``); tests give it one whose groups replay a script."""

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
    """Connects a run to its cluster, chooses an attempt's workers and starts its ranks."""

    def connect(
        self, plan: RunPlan, client: Client | None
    ) -> AbstractContextManager[Client | None]: ...

    def claims(
        self, client: Client | None, owner: str
    ) -> AbstractContextManager[GpuClaims | None]: ...

    def select(
        self,
        client: Client | None,
        plan: RunPlan,
        unresponsive: frozenset[str],
        poll: Callable[[], None],
        claims: GpuClaims | None,
    ) -> list[WorkerSlot]: ...

    def start(
        self,
        client: Client | None,
        slots: list[WorkerSlot],
        build: LaunchBuilder,
        handle: MessageHandler,
        resources: dict[str, float] | None,
    ) -> AbstractContextManager[Group]: ...


class DaskPlacement:
    """Ranks on the Dask workers of the run's cluster, one each."""

    def connect(
        self, plan: RunPlan, client: Client | None
    ) -> AbstractContextManager[Client | None]:
        """``client``'s cluster, else the one the plan's DaskConfig names or starts (closed on
        leaving: ``cluster.connect``)."""
        from trainlib._internal.driver import (
            cluster,  # imported on use: rank processes never need Dask
        )

        return cluster.connect(plan.dask_config, plan.scaling.worker_range[1], client)

    def claims(self, client: Client | None, owner: str) -> AbstractContextManager[GpuClaims | None]:
        """The GPUs ``owner`` holds across its attempts, on ``client``'s scheduler (released on
        leaving)."""
        from trainlib._internal.driver.gpu_claims import GpuClaims

        assert client is not None, "connected to a cluster"
        return GpuClaims(client, owner)

    def select(
        self,
        client: Client | None,
        plan: RunPlan,
        unresponsive: frozenset[str],
        poll: Callable[[], None],
        claims: GpuClaims | None,
    ) -> list[WorkerSlot]:
        """The workers of the next attempt, avoiding ``unresponsive`` ones; for a search's
        trial, among its lease; for GPUs, claimed in ``claims`` (see ``select_workers``)."""
        from trainlib._internal.driver import worker_selection

        assert client is not None, "connected to a cluster"
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
        client: Client | None,
        slots: list[WorkerSlot],
        build: LaunchBuilder,
        handle: MessageHandler,
        resources: dict[str, float] | None,
    ) -> AbstractContextManager[Group]:
        """One rank per slot, supervised on its worker (``WorkerGroup.start``)."""
        from trainlib._internal.driver.worker_group import WorkerGroup

        assert client is not None, "connected to a cluster"
        return WorkerGroup.start(client, slots, build, handle, resources)
