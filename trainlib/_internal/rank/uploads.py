"""A rank's checkpoint uploads and report messages: in order, at most one upload at a time.

With ``checkpoint_upload_mode="async"``, ``report()`` hands the checkpoint's files over (copied
into a staging directory, or moved there when the local copy is to be deleted) and returns; a
background thread uploads them and only then sends the report message, so the driver commits
the checkpoint once every rank's upload has finished and been checked. Reports made meanwhile
without a checkpoint wait in order behind it; the next report with a checkpoint waits for the
upload. A failed upload is raised by the rank's next ``report()``, or when its training
function returns, so the run fails with it.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import multiprocessing
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psutil

from trainlib._internal.common.commit_marker import FileEntry
from trainlib._internal.common.messages import CheckpointsQuery, ReportMessage
from trainlib._internal.common.storage import RunStorage
from trainlib.checkpoint import Checkpoint
from trainlib.errors import CheckpointError

Message = ReportMessage | CheckpointsQuery
_LOWEST_PRIORITY = 19
_STAGING_PREFIX = "trainlib-staging-"
_STAGING_DIR = re.compile(rf"\.?{_STAGING_PREFIX}(\d+)-")


class Uploads:
    """One rank's outgoing reports, and its upload helper process; ``send`` is the session's
    (thread-safe) message sender. A rank has one session, so one ``Uploads``."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self._send = send
        self._lock = threading.Condition()
        self._waiting: list[Message] = []  # sent once the upload in flight has finished
        self._in_flight: threading.Thread | None = None
        self._staged: str | None = None
        self._failure: CheckpointError | None = None
        self._helper: ProcessPoolExecutor | None = None  # this rank's upload process
        self._helper_lock = threading.Lock()

    def send(self, message: Message) -> None:
        """Send ``message`` after every message before it (the one of an upload in flight).

        Raises:
            CheckpointError: An earlier upload failed.
        """
        with self._lock:
            self._raise_failure()
            if self._in_flight is not None:
                self._waiting.append(message)
                return
            self._send(message)

    def wait(self) -> None:
        """Block until no upload is in flight.

        Raises:
            CheckpointError: That upload failed.
        """
        with self._lock:
            while self._in_flight is not None:
                self._lock.wait()
            self._raise_failure()

    def start(self, index: int, staged: str, upload: Callable[[str], ReportMessage]) -> None:
        """Upload the staged directory in the background: ``upload(staged)`` returns the
        report message, sent when it returns. The caller has waited for the previous one."""
        with self._lock:
            assert self._in_flight is None, "one upload at a time: wait() first"
            self._staged = staged
            self._in_flight = threading.Thread(
                target=self._run, args=(index, staged, upload), name="trainlib-upload", daemon=True
            )
            self._in_flight.start()

    def abandon(self) -> None:
        """The rank is failing: remove the staged files of an upload still in flight."""
        staged = self._staged
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)

    def _run(self, index: int, staged: str, upload: Callable[[str], ReportMessage]) -> None:
        message: ReportMessage | None = None
        failure: CheckpointError | None = None
        with contextlib.suppress(OSError, AttributeError):  # Linux: nice is per thread
            # the lowest priority for this thread and the helper process it starts
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _LOWEST_PRIORITY)
        try:
            message = upload(staged)
        except BaseException as exc:
            failure = CheckpointError(
                f"The upload of report {index}'s checkpoint (checkpoint_upload_mode='async') "
                f"failed: {exc}"
            )
            failure.__cause__ = exc
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        with self._lock:
            try:
                if failure is None:
                    assert message is not None
                    for waiting in [message, *self._waiting]:
                        self._send(waiting)
            except BaseException as exc:  # the supervisor is gone; the rank exits anyway
                failure = CheckpointError(f"Could not send report {index}: {exc}")
            self._failure = failure
            self._waiting.clear()
            self._in_flight = None
            self._staged = None
            self._lock.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def upload_in_helper(
        self, storage: RunStorage, local_dir: str, index: int, name: str | None
    ) -> dict[str, FileEntry]:
        """``storage.upload_directory`` in a helper process of this rank, started on first use.

        Run in a thread of the rank instead, the training step after an async 256 MB checkpoint
        took 5.1 s instead of 0.5 s (the upload's hashing, HTTP and signing share the GIL and the
        CPU; benchmarks/checkpoint_upload.py); in this process at the lowest priority, 0.5 s. The
        helper's log records (each retry) go to this process's loggers: rank 0's reach the driver.
        """
        with self._helper_lock:
            if self._helper is None:
                context = multiprocessing.get_context("spawn")  # never fork a running torch
                records: Any = context.Queue()
                logging.handlers.QueueListener(records, _Relay()).start()
                self._helper = ProcessPoolExecutor(
                    1, mp_context=context, initializer=_send_logs_to, initargs=(records,)
                )
            helper = self._helper
        return helper.submit(storage.upload_directory, local_dir, index, name).result()


def stage(checkpoint: Checkpoint, move: bool) -> str:
    """A new local directory holding the checkpoint's files. With ``move``, a local checkpoint
    directory is renamed (the staging directory is its sibling: no copy, whatever the size),
    as Ray's ``delete_local_checkpoint_after_upload`` deletes it; otherwise, or where it cannot
    be renamed, its files are copied (moved) into a temporary directory."""
    _remove_stale_staging()
    if move and checkpoint.is_local:
        source = checkpoint.path.rstrip("/")
        sibling = f"{os.path.dirname(source)}/.{_STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        try:
            os.rename(source, sibling)
            return sibling
        except OSError:
            pass  # e.g. its parent is read-only: move the files instead
    staged = tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{os.getpid()}-")
    try:
        if not checkpoint.is_local:
            checkpoint.to_directory(staged)
        elif move:
            for entry in os.listdir(checkpoint.path):
                shutil.move(os.path.join(checkpoint.path, entry), os.path.join(staged, entry))
            delete_local(checkpoint)
        else:
            shutil.copytree(checkpoint.path, staged, dirs_exist_ok=True)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged


class _Relay(logging.Handler):
    """Hands the helper's log records to this process's loggers of the same name."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


def _send_logs_to(records: Any) -> None:
    """In the helper: the lowest CPU priority (among the rank's processes, training comes
    first), and every log record of INFO and above goes to the rank process."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, _LOWEST_PRIORITY)
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(logging.INFO)


def delete_local(checkpoint: Checkpoint) -> None:
    """Delete a local checkpoint directory (a ``TemporaryDirectory`` tolerates it gone)."""
    if checkpoint.is_local:
        shutil.rmtree(checkpoint.path, ignore_errors=True)


def _remove_stale_staging() -> None:
    """Remove the temporary directory's staging directories of rank processes that are gone
    (killed mid-upload). A renamed checkpoint directory of such a rank stays where it was."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            match = _STAGING_DIR.match(name)
            if match and not psutil.pid_exists(int(match.group(1))):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
