"""One attempt's ranks: a rank per chosen Dask worker, started, polled and stopped (Ray Train
v2's ``WorkerGroup``). The controller decides what a poll's ``GroupStatus`` means
(``controller``); the group only relays the ranks' messages and says how they are."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from distributed import Client, Event, Future, Queue

from trainlib._internal.common.driver_pulse import PulseSender, fence_summary
from trainlib._internal.common.messages import (
    DriverMessage,
    RankLaunch,
    ToRank,
)
from trainlib._internal.common.waiting import Completions, Mailbox, result_within
from trainlib._internal.driver.group_status import GroupStatus
from trainlib._internal.driver.ranks import WorkerSlot
from trainlib._internal.driver.retirements import Retirements
from trainlib._internal.driver.run_plan import find_free_port
from trainlib._internal.driver.worker_selection import worker_statuses
from trainlib._internal.worker import command_relay
from trainlib._internal.worker.supervisor import RankOutcome, supervise_rank
from trainlib.errors import RankFailure

STOP_TIMEOUT_S = 10.0
_LIVENESS_CHECK_S = 1.0
_STOP_POLL_S = 0.2

LaunchBuilder = Callable[[WorkerSlot, str, int], RankLaunch]
MessageHandler = Callable[[DriverMessage], None]


class WorkerGroup:
    """The supervisors of one attempt, their message queue and their stop event; the ranks'
    messages go to ``handle`` as they are polled."""

    def __init__(
        self,
        client: Client,
        slots: list[WorkerSlot],
        futures: list[Future[RankOutcome]],
        queue: Queue,
        stop: Event,
        handle: MessageHandler,
        pulse: PulseSender | None = None,
    ) -> None:
        self._client = client
        self._pulse = pulse
        self._slots = slots
        self._futures = futures
        self._queue = queue
        self._stop = stop
        self._handle = handle
        self._outcomes: dict[int, RankOutcome] = {}
        self._unresponsive: set[str] = set()
        self._retirements = Retirements(client, slots, self._deliver)
        self._completions = Completions(futures)
        self._mail = Mailbox(queue, self._completions.wake)
        self._next_liveness_check = time.monotonic() + _LIVENESS_CHECK_S

    @classmethod
    @contextmanager
    def start(
        cls,
        client: Client,
        slots: list[WorkerSlot],
        build_launch: LaunchBuilder,
        handle: MessageHandler,
        resources: dict[str, float] | None = None,
    ) -> Iterator[WorkerGroup]:
        """Start one rank per slot, its messages to ``handle``; on leaving, every rank is
        stopped and its task released."""
        token = uuid.uuid4().hex[:12]
        queue = Queue(f"trainlib-reports-{token}", client=client)
        stop = Event(f"trainlib-stop-{token}", client=client)
        rank0 = slots[0]
        port_future = client.submit(
            find_free_port, workers=[rank0.address], allow_other_workers=False, pure=False
        )
        port = result_within(port_future, STOP_TIMEOUT_S, give_up=lambda: True)
        launches = [build_launch(slot, rank0.host, port) for slot in slots]
        timeout_s = launches[0].driver_timeout_s
        pulse = None
        if timeout_s is not None:
            pulse = PulseSender(client, f"trainlib-pulse-{token}", timeout_s)
        futures = [
            client.submit(
                supervise_rank,
                launch,
                queue.name,
                stop.name,
                pulse.name if pulse is not None else None,
                key=f"trainlib-rank-{slot.world_rank}-{token}",
                workers=[slot.address],
                allow_other_workers=False,
                pure=False,
                resources=resources,
            )
            for slot, launch in zip(slots, launches, strict=True)
        ]
        group = cls(client, slots, futures, queue, stop, handle, pulse)
        try:
            yield group
        finally:
            group._shut_down()

    @property
    def size(self) -> int:
        """The number of ranks."""
        return len(self._slots)

    def poll(self, timeout_s: float) -> GroupStatus:
        """Wait up to ``timeout_s`` for a rank's task to end or a message to come, relay the
        messages to the handler, and say how the ranks are. Once every rank ended, what they
        said before their tasks ended (e.g. their last report) is relayed too."""
        self._wait_for_any(timeout_s)
        self._drain()
        self._collect_done()
        if time.monotonic() >= self._next_liveness_check:
            self._next_liveness_check = time.monotonic() + _LIVENESS_CHECK_S
            self._check_workers_alive()
        if len(self._outcomes) == len(self._futures):
            self._mail.flush()
            self._drain()
        return self.status()

    def status(self, stopped: bool = False) -> GroupStatus:
        """How the ranks are, as last seen; a worker of a failed rank that retired gracefully
        is taken for retiring (its rank preempted)."""
        failures = self._failures()
        self._retirements.ended(set(failures))
        ranks, retiring = len(self._slots), self._retirements.ranks
        return GroupStatus(ranks, frozenset(self._outcomes), failures, retiring, stopped)

    def fail(self, failures: dict[int, RankFailure]) -> GroupStatus:
        """Take these ranks for failed (the hang watchdog named them); the status now."""
        for rank, failure in failures.items():
            self._outcomes.setdefault(rank, RankOutcome(rank, failure))
        return self.status()

    def stop(self) -> GroupStatus:
        """Stop every rank still running (bounded, see ``STOP_TIMEOUT_S``) and relay what they
        said; the final status, the end of every preempted worker's rank called a preemption."""
        self._stop_all()
        self._retirements.mark_preempted(self._outcomes)
        self._mail.flush()
        self._drain()
        return self.status(stopped=True)

    def send(self, message: ToRank) -> None:
        """Deliver ``message`` to every rank (through its supervisor), in rank order.

        A rank that cannot take it (its supervisor ended, its worker left) is found by the
        next ``poll``.
        """
        self._deliver(message, [slot.address for slot in self._slots])

    def send_to(self, world_rank: int, message: ToRank) -> None:
        """Deliver ``message`` to one rank (an answer to its question); a rank gone is found
        by the next ``poll``."""
        slot = next(s for s in self._slots if s.world_rank == world_rank)
        self._deliver(message, [slot.address])

    def _deliver(self, message: ToRank, addresses: list[str]) -> None:
        self._client.run(
            command_relay.deliver, self._queue.name, message, workers=addresses, on_error="return"
        )

    def _failures(self) -> dict[int, RankFailure]:
        """The ranks' failures; once the driver missed its own pulse (it was frozen: its ranks
        stopped themselves, or will), every rank that did not end well is taken for fenced."""
        failures = {r: o.failure for r, o in self._outcomes.items() if o.failure is not None}
        if self._pulse is None or (lapsed := self._pulse.lapsed()) is None:
            return failures
        summary = fence_summary(lapsed, self._pulse.timeout_s)
        return {
            s.world_rank: RankFailure(s.world_rank, s.host, "fenced", summary, time=time.time())
            for s in self._slots
            if s.world_rank not in self._outcomes or s.world_rank in failures
        }

    def _drain(self) -> None:
        for message in self._mail.take_all():
            self._handle(message)

    def _wait_for_any(self, timeout_s: float) -> None:
        """Return when a rank's task ends or a message comes, or after ``timeout_s``."""
        if any(not f.done() for f in self._futures) and not self._mail.has_mail():
            self._completions.wait(timeout_s)

    def _collect_done(self) -> None:
        for slot, future in zip(self._slots, self._futures, strict=True):
            if slot.world_rank in self._outcomes or not future.done():
                continue
            if future.status == "finished":
                self._outcomes[slot.world_rank] = future.result()
            else:
                summary = f"the rank's Dask task failed on {slot.address}: {future.exception()!r}"
                self._record(slot, "exception", summary)

    def _check_workers_alive(self) -> None:
        """Record the ranks whose worker left; tell every rank when one of their workers
        starts retiring (``get_preemption_info``)."""
        statuses = worker_statuses(self._client)
        self._retirements.seen(statuses)
        for slot in self._slots:
            if slot.address not in statuses and slot.world_rank not in self._outcomes:
                self._record(slot, "worker_lost", f"Dask worker {slot.address} left the cluster")

    def _record(self, slot: WorkerSlot, kind: Any, summary: str) -> None:
        failure = RankFailure(slot.world_rank, slot.host, kind, summary, time=time.time())
        self._outcomes[slot.world_rank] = RankOutcome(slot.world_rank, failure)

    def _stop_all(self) -> None:
        """Ask every supervisor to stop its rank, and wait (bounded) until they have.

        Ranks whose Dask worker left are not waited for; a task still running at the deadline
        marks its worker unresponsive.
        """
        self._stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            self._collect_done()
            self._check_workers_alive()
            pending = [
                f
                for s, f in zip(self._slots, self._futures, strict=True)
                if not f.done() and s.world_rank not in self._lost_ranks()
            ]
            if not pending or time.monotonic() >= deadline:
                break
            self._completions.wait(_STOP_POLL_S)
        self._collect_done()  # a task that ended after the last collection emptied `pending`
        for slot in self._slots:
            if slot.world_rank not in self._outcomes:
                self._record(slot, "worker_lost", f"did not stop within {STOP_TIMEOUT_S:g} s")
        lost = self._lost_ranks()
        self._unresponsive = {
            slot.address
            for slot, future in zip(self._slots, self._futures, strict=True)
            if not future.done() or slot.world_rank in lost
        }

    def _lost_ranks(self) -> set[int]:
        return {
            r
            for r, o in self._outcomes.items()
            if o.failure is not None and o.failure.kind in ("worker_lost", "preempted")
        }

    @property
    def unresponsive_workers(self) -> set[str]:
        """Workers that left, or whose rank task did not end when stopped (e.g. a host cut
        off the network). The next attempt avoids them."""
        return self._unresponsive

    def _shut_down(self) -> None:
        if len(self._outcomes) < len(self._futures):
            self._stop_all()
        self._client.cancel(self._futures)
        if self._pulse is not None:
            self._pulse.close()
        self._mail.close()
        self._queue.close()
        self._stop.clear()
