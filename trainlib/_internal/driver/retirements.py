"""Which of an attempt's Dask workers retire gracefully (a preemption: ``retire_workers``,
``close_gracefully``, SLURM's preemption signal), however it is seen: a liveness check finds
the worker retiring, or, once its rank ended, the scheduler's log says it retired. Every rank
is told when one of the group's workers starts retiring (``get_preemption_info``), the group's
status names the preempted ranks (for the preemption grace: ``preemption_grace``), and the end
of a preempted worker's rank is called a preemption, not a failure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from distributed import Client

from trainlib._internal.common.messages import PreemptionNotice, ToRank
from trainlib._internal.driver.ranks import WorkerSlot
from trainlib._internal.driver.worker_selection import retired_gracefully, worker_statuses
from trainlib._internal.worker.supervisor import RankOutcome
from trainlib.preemption import PreemptionInfo

RETIRING = "closing_gracefully"  # a worker's status while it retires
Deliver = Callable[[ToRank, list[str]], None]  # (message, worker addresses)


class Retirements:
    """The group's workers seen retiring, and what follows from it."""

    def __init__(self, client: Client, slots: list[WorkerSlot], deliver: Deliver) -> None:
        self._client = client
        self._slots = slots
        self._deliver = deliver
        self._retiring: set[str] = set()  # the group's workers seen retiring gracefully
        self._asked: dict[str, bool] = {}  # retired gracefully, asked of the scheduler

    def seen(self, statuses: dict[str, str]) -> None:
        """The workers' statuses now (a liveness check): tell every rank when one of the
        group's workers starts retiring."""
        retiring = {s.address for s in self._slots if statuses.get(s.address) == RETIRING}
        if retiring - self._retiring:
            self._retiring |= retiring
            self._notify()

    @property
    def ranks(self) -> frozenset[int]:
        """The ranks whose worker was seen retiring."""
        return frozenset(s.world_rank for s in self._slots if s.address in self._retiring)

    def ended(self, ranks: set[int]) -> None:
        """These ranks ended: a worker among theirs that retired gracefully before a liveness
        check saw it retiring is taken for retiring now (every rank told)."""
        addresses = {slot.address for slot in self._slots if slot.world_rank in ranks}
        retired = {a for a in addresses - self._retiring if self._retired(a)}
        if retired:
            self._retiring |= retired
            self._notify()

    def mark_preempted(self, outcomes: dict[int, RankOutcome]) -> None:
        """Call the end of every rank whose worker retired gracefully a preemption, however it
        was seen first: the worker gone, the rank killed, or its supervisor stopped. The
        scheduler's log of the worker says so even when the retirement was too quick for a
        liveness check to see the worker retiring."""
        retired: dict[str, bool] = {}
        for slot in self._slots:
            outcome = outcomes.get(slot.world_rank)
            failure = outcome.failure if outcome is not None else None
            if failure is None or failure.kind not in ("exit", "stopped", "worker_lost"):
                continue
            if slot.address not in retired:
                retired[slot.address] = slot.address in self._retiring or retired_gracefully(
                    self._client, slot.address
                )
            if retired[slot.address]:
                summary = f"Dask worker {slot.address} retired gracefully (preempted)"
                preempted = replace(failure, kind="preempted", summary=summary)
                outcomes[slot.world_rank] = RankOutcome(slot.world_rank, preempted)

    def _retired(self, address: str) -> bool:
        if address not in self._asked:
            self._asked[address] = address in self._retiring or retired_gracefully(
                self._client, address
            )
        return self._asked[address]

    def _notify(self) -> None:
        ranks: dict[str, list[int]] = {}
        for slot in self._slots:
            if slot.address in self._retiring:
                ranks.setdefault(slot.address, []).append(slot.world_rank)
        present = worker_statuses(self._client)  # one gone already would hold the send 30 s
        self._deliver(
            PreemptionNotice(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks=ranks)),
            [slot.address for slot in self._slots if slot.address in present],
        )
