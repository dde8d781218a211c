"""The run controller on a Dask cluster: one training run from start to Result, through its
attempts, as Ray Train v2's ``TrainController`` runs it.

The run is one loop, here: ``step`` dispatches on the current state (``controller_state``):
scheduling -> running -> (resizing | restarting -> scheduling -> running)* -> finished |
errored | aborted. While running, each step polls the worker group (``GroupStatus``) and asks
the failure policy (``failure_policy``: wait, stop the others, restart or raise) and the scaling
policy (``scaling_policy``: grow an elastic group); the terminal state is entered in one place
(``RunRecord.conclude``). What the run keeps across attempts is its ``RunRecord``. Front ends
(TorchTrainer, a Tuner trial) build a ``RunPlan`` and call ``run_training``; ``num_workers=0``
runs it in this thread (``local_mode``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from trainlib._internal.common.messages import DriverMessage, ToRank
from trainlib._internal.driver.controller_state import Resizing, Restarting, Running, Scheduling
from trainlib._internal.driver.failure_policy import FailureDecision, Pending
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.placement import DaskPlacement, Group, Placement
from trainlib._internal.driver.preemption_grace import PreemptionGrace
from trainlib._internal.driver.run_plan import AttemptStart, RunPlan, rank_launch
from trainlib._internal.driver.run_record import RunCancelled as RunCancelled  # the interface's
from trainlib._internal.driver.run_record import RunRecord
from trainlib._internal.driver.watchdog import ProgressWatchdog
from trainlib.callbacks import GroupInfo
from trainlib.logging_config import LoggingConfig
from trainlib.result import Result

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.controller_callbacks import ControllerCallback
    from trainlib._internal.driver.gpu_claims import GpuClaims
    from trainlib._internal.driver.scaling_policy import ScalingPolicy

POLL_S = 0.5  # the longest wait of one step; a rank's task ending or a message ends it sooner


@dataclass
class _Attempt:
    """The attempt now running: its group, hang watchdog and scaling policy; ``stack`` stops
    the group when closed."""

    group: Group
    watchdog: ProgressWatchdog
    scaling: ScalingPolicy
    stack: ExitStack


def run_training(plan: RunPlan, client: Client | None = None) -> Result:
    """Run ``plan`` to its end on ``client`` (or on the cluster its DaskConfig names); with
    ``num_workers=0``, in this thread.

    Ctrl-C in the main thread stops every rank and raises ``KeyboardInterrupt`` here.

    Raises:
        WorkerGroupError: A rank failed more often than ``FailureConfig.max_failures``.
        NotEnoughWorkersError: The cluster cannot provide ``num_workers`` workers.
    """
    from trainlib._internal.driver.local_mode import LocalPlacement

    with InterruptWatch(), LoggingConfig.of(plan.run_config.logging_config).applied():
        local = plan.scaling.worker_range[1] == 0
        return TrainController(plan, LocalPlacement(plan) if local else None).run(client)


class TrainController:
    """Runs a ``RunRecord``'s attempts on a Dask cluster, its concerns on the lifecycle's hooks
    (``controller_callbacks``). A front end that steps the run itself (``trainlib.sgd``'s live
    group) uses ``connected``, ``gpu_claims``, ``step``, ``send``, ``allow_restarts``,
    ``restarting`` and ``conclude``. Where the ranks run is the ``placement``'s (the run's Dask
    cluster unless given); ``automatic_hang_timeout=False`` checks hangs only with a
    ``hang_timeout_s`` (calls of very different lengths)."""

    def __init__(
        self, plan: RunPlan, placement: Placement | None = None, automatic_hang_timeout: bool = True
    ) -> None:
        self.record = RunRecord(plan)
        self.plan = plan
        self._automatic_hang_timeout = automatic_hang_timeout
        self.placement: Placement = placement or DaskPlacement()
        self._current: _Attempt | None = None
        self.name = self.record.name
        self.unresponsive: set[str] = set()  # workers that did not answer: avoided
        self.callbacks = self._callbacks()
        self.record.lifecycle.listeners.extend(
            callback.after_controller_state_update for callback in self.callbacks
        )

    def _callbacks(self) -> tuple[ControllerCallback, ...]:
        """The run's concerns on the controller's lifecycle (``controller_callbacks``)."""
        from trainlib._internal.driver.controller_callbacks.checkpoint_validation import (
            CheckpointValidation,
        )
        from trainlib._internal.driver.controller_callbacks.dataset_check import DatasetCheck
        from trainlib._internal.driver.controller_callbacks.lease_withholding import (
            LeaseWithholding,
        )
        from trainlib._internal.driver.controller_callbacks.user_callbacks import UserCallbacks
        from trainlib._internal.driver.controller_callbacks.worker_plugins import WorkerPlugins

        record = self.record
        validations = record.collector.validations
        callbacks: list[ControllerCallback] = [
            WorkerPlugins(),
            CheckpointValidation(validations, record.manager, self.poll),
            DatasetCheck(self.plan.datasets),
        ]
        if self.plan.lease is not None:
            callbacks.append(LeaseWithholding(self.plan.lease))
        callbacks.append(UserCallbacks(record.callbacks, record.start_callbacks))  # the last
        return tuple(callbacks)

    def run(self, client: Client | None) -> Result:
        """The whole run, to its Result: steps until training ended well or a step raised
        (the failure policy, Ctrl-C, a cancelled trial)."""
        error: BaseException | None = None
        try:
            with self.connected(client) as connected:
                with self.gpu_claims(connected) as claims:  # the run's GPUs, for all attempts
                    try:
                        while not self.step(connected, claims):
                            pass
                    finally:
                        self.end_attempt()
                for callback in self.callbacks:
                    callback.after_run_trained()
        except BaseException as exc:
            error = exc
        return self.record.conclude(error)

    def step(self, client: Client | None, claims: GpuClaims | None) -> bool:
        """One step of the run, by its state: running, one poll of the group and the policies'
        decisions on it; restarting or resizing, the group stopped and the next one formed
        (from the run's start, the first). True once training ended well."""
        state = self.record.lifecycle.state
        if isinstance(state, Running) and self._current is not None:
            return self._watch()
        self.end_attempt()  # restarting or resizing, or a live group's failure: ranks stopped
        self.record.lifecycle.enter(Scheduling(self.record.attempt))
        self._form(client, claims)
        return False

    def _watch(self) -> bool:
        """Poll the running group once; enter the state the policies decide on (a failure
        the policy does not restart from is raised)."""
        current = self._current
        assert current is not None, "a running attempt has a group"
        self.poll()
        status = current.group.poll(POLL_S)
        if hung := current.watchdog.check():
            status = current.group.fail(hung)
        policy = self.record.failure_policy
        decision = policy.decide(status)
        if decision is Pending.STOP:
            decision = policy.decide(current.group.stop())
        if isinstance(decision, FailureDecision):
            for callback in self.callbacks:
                callback.after_worker_group_failure(decision)
            if not decision.restart:
                raise decision.error
            self.record.lifecycle.enter(Restarting(decision))
        elif status.finished:
            self.end_attempt()
            self.record.collector.check_all_complete()
            return True
        elif decision is None and (resize := current.scaling.decide(status)) is not None:
            self.record.lifecycle.enter(Resizing(resize))  # the ranks stop: not a failure
        return False

    def _form(self, client: Client | None, claims: GpuClaims | None) -> None:
        """Start the next attempt (``attempt``), with its preemption grace and scaling
        policy."""
        record = self.record
        with ExitStack() as stack:  # the group stopped if anything below raises
            group, watchdog = stack.enter_context(self.attempt(client, claims))
            failure_config = self.plan.run_config.failure_config
            grace = PreemptionGrace(failure_config, record.collector, record.manager, group.size)
            record.failure_policy.start_attempt(grace)
            scaling = self._scaling_policy(client, group.size)
            self._current = _Attempt(group, watchdog, scaling, stack.pop_all())

    def end_attempt(self) -> None:
        """Stop the current attempt's ranks, if any (safe to call twice)."""
        current, self._current = self._current, None
        if current is not None:
            current.stack.close()

    def _scaling_policy(self, client: Client | None, group_size: int) -> ScalingPolicy:
        """When this attempt's elastic group should grow (never for a search's trial, whose
        workers the search hands out, nor in local mode)."""
        from trainlib._internal.driver.scaling_policy import ScalingPolicy, scaling_policy

        scaling = self.plan.scaling
        if self.plan.lease is not None or client is None:
            full = replace(scaling, num_workers=group_size)  # a full group: never grows
            return ScalingPolicy(full, group_size, checkpointed=lambda: False, eligible=lambda: 0)
        return scaling_policy(client, scaling, group_size, self.record.manager)

    @contextmanager
    def connected(self, client: Client | None) -> Iterator[Client | None]:
        """The run's cluster (the placement's: ``client``'s, else the one its DaskConfig names
        or starts), the controller callbacks started on it; on leaving, they are told the run
        ends and a cluster the run started is closed."""
        with self.placement.connect(self.plan, client) as connected:
            try:
                for callback in self.callbacks:
                    callback.after_controller_start(connected)
                yield connected
            finally:
                for callback in self.callbacks:
                    callback.before_controller_shutdown()

    def gpu_claims(self, client: Client | None) -> AbstractContextManager[GpuClaims | None]:
        """The GPUs the run holds across its attempts (released on leaving)."""
        return self.placement.claims(client, self.name)

    @contextmanager
    def attempt(
        self, client: Client | None, claims: GpuClaims | None
    ) -> Iterator[tuple[Group, ProgressWatchdog]]:
        """Form the next group, resuming from the latest intact checkpoint (or the plan's), its
        GPUs claimed in the run's ``claims``, its messages to ``handle``; on leaving, its ranks
        are stopped. Workers unresponsive before are avoided."""
        record = self.record
        start_index, resume_from = record.resume_point()
        unresponsive = frozenset(self.unresponsive)
        slots = self.placement.select(client, self.plan, unresponsive, self.poll, claims)
        for callback in self.callbacks:
            callback.before_worker_group_start(client, slots)
        record.lifecycle.enter(Running(record.attempt, len(slots), str(resume_from or "scratch")))
        timeout = self.plan.run_config.failure_config.hang_timeout_s
        watchdog = ProgressWatchdog(timeout, slots, automatic=self._automatic_hang_timeout)
        record.collector.start_attempt(len(slots), start_index, watchdog)
        plan, storage, payload = self.plan, record.storage, record.setup_payload
        start = AttemptStart(plan, self.name, storage, start_index, resume_from, slots, payload)
        build = functools.partial(rank_launch, start)
        resources = dict(self.plan.scaling.resources_per_worker or {}) or None
        group: Group | None = None
        ranks = tuple(s.placement() for s in sorted(slots, key=lambda slot: slot.world_rank))
        info = GroupInfo(record.attempt, ranks, client)
        try:
            with self.placement.start(client, slots, build, self.handle, resources) as group:
                record.collector.reply_with(group.send_to)
                for callback in self.callbacks:
                    callback.after_worker_group_start(info)
                try:
                    yield group, watchdog
                finally:
                    for callback in self.callbacks:
                        callback.before_worker_group_shutdown(info)
        finally:  # also when the run stops by raising (a pruned trial, Ctrl-C)
            if group is not None:  # known once the group was stopped
                self.unresponsive |= group.unresponsive_workers
                for callback in self.callbacks:
                    callback.after_worker_group_shutdown(group)

    def handle(self, message: DriverMessage) -> None:
        """A message of a rank: to the run's report collector."""
        self.record.collector.handle(message)

    @property
    def restarting(self) -> bool:
        """The failure policy restarts the run: the next step forms a new group."""
        return isinstance(self.record.lifecycle.state, Restarting)

    def allow_restarts(self, restarts: int) -> None:
        """Restart at most ``restarts`` more times from now on, whatever the failure (a live
        group's call)."""
        self.record.failure_policy.allow_restarts(restarts)

    def send(self, message: ToRank) -> None:
        """Send ``message`` to every rank of the running group (a live group's command); the
        hang watchdog's clock restarts now."""
        current = self._current
        assert current is not None, "a running attempt has a group"
        current.watchdog.resume()
        current.group.send(message)

    def conclude(self, error: BaseException | None) -> Result:
        """End the run: its terminal state, the callbacks told; its Result (``error``, what
        ended it, raised)."""
        self.end_attempt()
        return self.record.conclude(error)

    def poll(self) -> None:
        """Raise to stop the run: ``KeyboardInterrupt`` after Ctrl-C; ``RunCancelled`` once the
        plan's ``cancel`` is set (the search running it as a trial stopped)."""
        InterruptWatch.check()
        self.record.collector.validations.poll()
        if self.plan.cancel is not None and self.plan.cancel.is_set():
            raise RunCancelled(f"Run {self.name} was stopped: the search that started it stopped")
