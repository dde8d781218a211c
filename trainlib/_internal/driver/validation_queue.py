"""Validates committed checkpoints (``report(validation=...)``) while the run trains: the
trainer's ``ValidationConfig.fn`` runs as a Dask task on the run's cluster, one at a time, in
report order, as Ray Train runs one validation task at a time. In local mode (no cluster) it
runs in the driver's thread, at the report."""

from __future__ import annotations

import logging
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainlib._internal.worker.validation_task import validate_checkpoint
from trainlib.errors import ControllerError
from trainlib.validation import ValidationConfig

if TYPE_CHECKING:
    from distributed import Client, Future

    from trainlib._internal.common.commit_marker import CommittedCheckpoint
    from trainlib._internal.common.waiting import Completions

logger = logging.getLogger(__name__)

Done = Callable[[int, "dict[str, Any] | None"], None]  # (report index, metrics or None: failed)
_WAIT_S = 0.5  # how often a wait for the last validations looks for Ctrl-C


class Validations:
    """The validations a run's reports asked for: queued, running (one), and ended."""

    def __init__(self, config: ValidationConfig | None, done: Done) -> None:
        self._config = config
        self._done = done
        self._queue: deque[tuple[CommittedCheckpoint, dict[str, Any]]] = deque()
        self._running: tuple[CommittedCheckpoint, Future[dict[str, Any]]] | None = None
        self._ended: Completions | None = None  # wakes a wait when a validation task ends
        self._client: Client | None = None

    def use(self, client: Client | None) -> None:
        """Run the validations on ``client``'s cluster (None: here, at once)."""
        from trainlib._internal.common.waiting import Completions  # Dask: only with a cluster

        self._client = client
        self._ended = Completions() if client is not None else None

    def request(self, committed: CommittedCheckpoint, overrides: dict[str, Any]) -> None:
        """Validate ``committed`` with the config's arguments updated by ``overrides``.

        Raises:
            ControllerError: The trainer was given no ``ValidationConfig``.
        """
        if self._config is None:
            raise ControllerError(
                f"report(validation=...) asked to validate {committed.checkpoint}, but the "
                "trainer has no validation function: pass validation_config="
                "trainlib.ValidationConfig(fn=...) to the trainer."
            )
        defaults = self._config.task_config.fn_kwargs if self._config.task_config else {}
        kwargs = {**defaults, **overrides}  # the report's arguments override the trainer's
        logger.debug("Validation of %s asked for with %s", committed.checkpoint, kwargs)
        if self._client is None:
            self._finish(committed, *_run_here(self._config, committed, kwargs))
            return
        self._queue.append((committed, kwargs))
        self.poll()

    def resume(self, waiting: list[CommittedCheckpoint]) -> None:
        """Validate the checkpoints a run of this name left waiting (it stopped first), with
        the arguments their reports asked for, as Ray Train does."""
        if not waiting:
            return
        names = ", ".join(str(c.checkpoint) for c in waiting)
        if self._config is None:
            logger.warning(
                "Checkpoints %s wait for a validation this trainer cannot run: give it "
                "validation_config=trainlib.ValidationConfig(fn=...) to run it",
                names,
            )
            return
        logger.info("Validating the checkpoints an earlier run left waiting: %s", names)
        for committed in waiting:
            self.request(committed, committed.validation or {})

    def poll(self) -> None:
        """Record the running validation if it ended; start the next one if none runs."""
        if self._running is not None and self._running[1].done():
            committed, future = self._running
            self._running = None
            self._finish(committed, *_outcome(future))
        if self._running is None and self._queue and self._client is not None:
            committed, kwargs = self._queue.popleft()
            assert self._config is not None  # request() refuses validations without one
            future = self._client.submit(
                validate_checkpoint,
                self._config.fn,
                committed.checkpoint,
                kwargs,
                key=f"trainlib-validate-{committed.index}-{uuid.uuid4().hex[:8]}",
                pure=False,
                **self._config.submit_kwargs,
            )
            self._running = (committed, future)
            self._warn_if_unplaceable()
            assert self._ended is not None  # set with the client
            self._ended.watch(future)
            logger.info("Validating checkpoint %s", committed.checkpoint)

    def _warn_if_unplaceable(self) -> None:
        """Say so when no worker has the resources the task asks for (it waits for one)."""
        from trainlib._internal.driver.worker_selection import eligible_workers

        assert self._config is not None and self._client is not None
        resources = self._config.submit_kwargs.get("resources")
        if resources and not eligible_workers(self._client, resources):
            logger.warning(
                "No Dask worker has the resources %s that ValidationConfig(submit_kwargs=...) "
                "asks for: the validation waits until one joins (check their names, or start "
                "workers with --resources)",
                resources,
            )

    def wait(self, poll: Callable[[], None]) -> None:
        """Until every validation asked for has ended; ``poll`` may raise to stop (Ctrl-C)."""
        while self._running is not None or self._queue:
            if self._ended is not None:
                self._ended.wait(_WAIT_S)
            poll()
            self.poll()

    def cancel(self) -> None:
        """Stop the validations not ended (the run stopped): their checkpoints' markers still
        say so, and the next run of this name runs them."""
        left = [c for c, _ in self._queue]
        self._queue.clear()
        if self._running is not None:
            committed, future = self._running
            self._running = None
            future.cancel()
            left.insert(0, committed)
        for committed in left:
            logger.warning(
                "Validation of checkpoint %s not ended: the next run of this name runs it",
                committed.checkpoint,
            )

    def _finish(
        self, committed: CommittedCheckpoint, metrics: dict[str, Any] | None, error: str
    ) -> None:
        if metrics is None:
            logger.error(
                "Validation of checkpoint %s failed; it keeps its reported metrics:\n%s",
                committed.checkpoint,
                error,
            )
        else:
            logger.info("Validated checkpoint %s: %s", committed.checkpoint, metrics)
        self._done(committed.index, metrics)


def _outcome(future: Future[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """A finished validation task's metrics, or None and why it failed."""
    if future.status == "finished":
        return future.result(), ""
    if future.status == "cancelled":
        return None, "its Dask task was cancelled"
    error = future.exception()
    return None, "".join(traceback.format_exception(error)).rstrip()


def _run_here(
    config: ValidationConfig, committed: CommittedCheckpoint, kwargs: dict[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """Local mode: the validation in this thread."""
    try:
        return validate_checkpoint(config.fn, committed.checkpoint, kwargs), ""
    except Exception as exc:
        return None, "".join(traceback.format_exception(exc)).rstrip()
