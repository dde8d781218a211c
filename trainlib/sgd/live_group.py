"""A worker group that stays formed between calls: the engine behind ``trainlib.sgd``.

The ranks are started by the same controller, supervisors and rank processes as a
``TorchTrainer.fit()``, and the live group drives the run the same way, by the controller's
``step``: their training function is a loop that answers the driver's commands (``Command``),
each with one ``report()`` from every rank. A call sends the command to every rank and steps
the run until that report is complete. A call may be given restarts (``train(max_retries=)``):
after a failure the controller forms a new group, whose ranks resume from the run's latest
committed checkpoint, and the call is sent again. A failure beyond them ends the group with a
``WorkerGroupError``.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING

from trainlib._internal.common.messages import SHUTDOWN, Command
from trainlib._internal.driver.controller import TrainController
from trainlib._internal.driver.interrupt import InterruptWatch
from trainlib._internal.driver.run_plan import RunPlan
from trainlib.callbacks import Callback, Report
from trainlib.errors import ControllerError, WorkerGroupError

if TYPE_CHECKING:
    from distributed import Client

    from trainlib._internal.driver.gpu_claims import GpuClaims

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
        # calls of very different lengths (a validate(), then a long train()): hangs are
        # checked only with a hang_timeout_s
        self._controller = TrainController(self._plan, automatic_hang_timeout=False)
        self._stack = ExitStack()
        self._client: Client | None = None
        self._claims: GpuClaims | None = None  # the run's GPUs, across its attempts
        self._formed = False
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
                live._form(restarts=0)
        except BaseException as exc:
            live._close(exc)  # raises exc
            raise
        return live

    @property
    def run_name(self) -> str:
        """The run's name (its directory under the storage path)."""
        return self._controller.name

    @property
    def is_formed(self) -> bool:
        """True while a group is up (not after a failure beyond a call's restarts)."""
        return self._formed

    def call(self, command: Command, restarts: int = 0, first: Command | None = None) -> Report:
        """Send ``command`` to every rank and return the report they answer it with.

        Args:
            restarts: After a rank fails, form a new group (resuming from the latest
                checkpoint) and send the command again, this many times at most.
            first: What a new group is sent before the command again (a state to load).

        Raises:
            WorkerGroupError: A rank failed (beyond ``restarts``); the group is stopped.
            KeyboardInterrupt: Ctrl-C; the group is stopped.
        """
        if not self._formed:
            raise RuntimeError("The live group's ranks were stopped after a failure.")
        with InterruptWatch():
            try:
                self._controller.allow_restarts(restarts)
                while not self._answered(command):
                    while not self._ready() or (first is not None and not self._answered(first)):
                        pass  # failed again while re-forming, within the restarts
                return self._answers.reports[-1]
            except BaseException:
                self._end_attempt()
                raise

    def close(self) -> None:
        """Ask every rank to end, stop those that do not within a bound, release the
        cluster (closed if this group started it). Safe to call twice."""
        self._close(None)
        logger.info("Run %s closed", self._controller.name)

    def _close(self, error: BaseException | None) -> None:
        """End the run (``error``: what ended it, raised once everything is released)."""
        if self._closed:
            return
        self._closed = True
        try:
            if error is None:
                with InterruptWatch():
                    self._shut_down_ranks()
        except BaseException as exc:
            error = exc
        finally:
            try:
                self._end_attempt()
                self._stack.close()  # the cluster, released as a run releases it
            finally:
                self._controller.conclude(error)

    def _form(self, restarts: int) -> None:
        """Form a group and wait for its ranks' first report."""
        self._controller.allow_restarts(restarts)
        try:
            while not self._ready():
                pass
        except BaseException:
            self._end_attempt()
            raise

    def _ready(self) -> bool:
        """Step the run to its next group and wait for the ranks' first report (set up and
        waiting for commands); False when they failed and the controller restarts."""
        self._formed = True
        self._step()  # from a restart, a failure or the start: the next group
        return self._next_report()

    def _answered(self, command: Command) -> bool:
        """Send ``command`` and step until its report is complete; False when a rank failed
        and the controller restarts (the command is lost with the group)."""
        self._controller.send(command)
        return self._next_report()

    def _next_report(self) -> bool:
        """Step until the ranks complete their next report (True), or the controller
        restarts after a failure (False)."""
        expected = len(self._answers.reports) + 1
        while len(self._answers.reports) < expected:
            if self._step():
                raise ControllerError(
                    f"The ranks of run {self._controller.name} ended without answering; "
                    "their loop must answer every command with one report()."
                )
            if self._controller.restarting:
                return False
        return True

    def _step(self) -> bool:
        return self._controller.step(self._client, self._claims)

    def _shut_down_ranks(self) -> None:
        """Send SHUTDOWN and step (bounded) until every rank has ended; a rank that fails
        meanwhile is only logged."""
        if not self._formed:
            return
        self._controller.allow_restarts(0)
        self._controller.send(Command(SHUTDOWN))
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        try:
            while not self._step() and time.monotonic() <= deadline:
                pass
        except WorkerGroupError as error:
            logger.warning("A rank failed while shutting down: %s", error.root_cause.one_line())

    def _end_attempt(self) -> None:
        """Stop the current group's ranks (if any) and release their tasks."""
        self._formed = False
        self._controller.end_attempt()
