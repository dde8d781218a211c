"""A worker group that stays formed between calls: the engine behind ``trainlib.sgd``.

The ranks are started once, by the same controller, supervisors and rank processes as a
``TorchTrainer.fit()``: their training function is a loop that answers the driver's commands
(``Command``), each with one ``report()`` from every rank. A call sends the command to every
rank (``WorkerGroup.send``) and polls the group until that report is complete. A rank failure
ends the group with a ``WorkerGroupError``; ``reform()`` starts a new one, whose ranks resume
from the run's latest committed checkpoint.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING

from trainlib._internal.common.messages import SHUTDOWN, Command
from trainlib._internal.driver.controller import POLL_S, TrainController
from trainlib._internal.driver.group_status import GroupStatus
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.callbacks import Callback, Report
from trainlib.errors import RankFailure, TrainingFailedError

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.gpu_claims import GpuClaims
    from trainlib._internal.driver.placement import Group
    from trainlib._internal.driver.watchdog import ProgressWatchdog

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0


class _Answers(Callback):
    """Keeps the reports of the live group's ranks: one per call."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def on_report(self, report: Report) -> None:
        self.reports.append(report)


class LiveGroup:
    """A formed group of ranks that runs one command at a time; use ``start``."""

    def __init__(self, plan: RunPlan) -> None:
        self._answers = _Answers()
        config = plan.run_config
        self._plan = replace(
            plan, run_config=replace(config, callbacks=[*config.callbacks, self._answers])
        )
        self._controller = TrainController(self._plan)
        self._stack = ExitStack()
        self._client: Client | None = None
        self._claims: GpuClaims | None = None  # the run's GPUs, across its attempts
        self._attempt: AbstractContextManager[tuple[Group, ProgressWatchdog]] | None = None
        self._group: Group | None = None
        self._watchdog: ProgressWatchdog | None = None
        self._closed = False

    @classmethod
    def start(cls, plan: RunPlan, client: Client | None = None) -> LiveGroup:
        """Connect to the cluster, form the group and wait until every rank is ready (its
        loop made its first report); on failure, everything started is stopped.

        Raises:
            WorkerGroupError: A rank failed while starting.
            NotEnoughWorkersError: The cluster cannot provide the ranks.
        """
        live = cls(plan)
        try:
            with InterruptWatch():
                controller = live._controller
                live._client = live._stack.enter_context(controller.connected(client))
                live._claims = live._stack.enter_context(controller.gpu_claims(live._client))
                live._form()
        except BaseException:
            live.close()
            raise
        return live

    @property
    def run_name(self) -> str:
        """The run's name (its directory under the storage path)."""
        return self._controller.name

    @property
    def is_formed(self) -> bool:
        """True while a group is up (not after a failure until ``reform()``)."""
        return self._group is not None

    def call(self, command: Command) -> Report:
        """Send ``command`` to every rank and return the report they answer it with.

        Raises:
            WorkerGroupError: A rank failed; the group is stopped (see ``reform``).
            KeyboardInterrupt: Ctrl-C; the group is stopped.
        """
        if self._group is None or self._watchdog is None:
            raise RuntimeError("The live group is not formed; call reform() first.")
        with InterruptWatch():
            self._watchdog.resume()
            self._group.send(command)
            return self._next_report()

    def reform(self) -> None:
        """Form a new group after a failure; its ranks resume from the latest checkpoint."""
        if self._closed:
            raise RuntimeError("The live group is closed.")
        self._end_attempt()
        with InterruptWatch():
            self._form()

    def close(self) -> None:
        """Ask every rank to end, stop those that do not within a bound, release the
        cluster (closed if this group started it). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        error: BaseException | None = None
        try:
            with InterruptWatch():
                self._shut_down_ranks()
        except BaseException as exc:
            error = exc
        finally:
            self._end_attempt()
            try:
                self._controller.end(error)
            finally:
                self._stack.close()
        logger.info("Run %s closed", self._controller.name)

    def _form(self) -> None:
        assert self._client is not None and self._claims is not None, "connected before forming"
        self._attempt = self._controller.attempt(self._client, self._claims)
        self._group, self._watchdog = self._attempt.__enter__()
        self._next_report()  # the ranks' first report: set up and waiting for commands

    def _next_report(self) -> Report:
        """Poll the group until the ranks complete their next report; on a failure end the
        attempt."""
        assert self._group is not None
        expected = len(self._answers.reports) + 1
        try:
            while len(self._answers.reports) < expected:
                status = self._poll()
                if status.failures:
                    raise self._controller.fail(dict(self._group.stop().failures))
                if status.all_ended:
                    raise TrainingFailedError(
                        f"The ranks of run {self._controller.name} ended without answering; "
                        "their loop must answer every command with one report()."
                    )
        except BaseException:
            self._end_attempt()
            raise
        return self._answers.reports[-1]

    def _poll(self) -> GroupStatus:
        """One poll of the group (Ctrl-C raised), hung ranks among the failures."""
        assert self._group is not None
        InterruptWatch.check()
        status = self._group.poll(POLL_S)
        if hung := self._hang_check():
            status = self._group.fail(hung)
        return status

    def _shut_down_ranks(self) -> None:
        """Send SHUTDOWN and wait (bounded) until every rank has ended."""
        if self._group is None or self._watchdog is None:
            return
        self._group.send(Command(SHUTDOWN))
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while time.monotonic() <= deadline and not self._poll().all_ended:
            pass

    def _hang_check(self) -> dict[int, RankFailure]:
        """The hung ranks, when ``hang_timeout_s`` is set. The watchdog's automatic timeout
        (from the intervals between reports) does not fit calls of very different lengths (a
        ``validate()``, then a long ``train()``): without a timeout there is no check."""
        assert self._watchdog is not None
        if self._plan.run_config.failure_config.hang_timeout_s is None:
            return {}
        return self._watchdog.check()

    def _end_attempt(self) -> None:
        """Stop the current group's ranks (if any) and release their tasks."""
        attempt, self._attempt = self._attempt, None
        self._group = self._watchdog = None
        if attempt is not None:
            attempt.__exit__(None, None, None)
