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
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable

import psutil

from trainlib._internal.messages import CheckpointsQuery, ReportMessage
from trainlib.checkpoint import Checkpoint
from trainlib.errors import CheckpointError

Message = ReportMessage | CheckpointsQuery
_STAGING_PREFIX = "trainlib-staging-"
_STAGING_DIR = re.compile(rf"{_STAGING_PREFIX}(\d+)-")


class Uploads:
    """One rank's outgoing reports; ``send`` is the session's (thread-safe) message sender."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self._send = send
        self._lock = threading.Condition()
        self._waiting: list[Message] = []  # sent once the upload in flight has finished
        self._in_flight: threading.Thread | None = None
        self._staged: str | None = None
        self._failure: CheckpointError | None = None

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


def stage(checkpoint: Checkpoint, move: bool) -> str:
    """A new local directory holding the checkpoint's files: moved out of a local checkpoint
    directory (a rename on the same filesystem) when ``move``, else copied. The checkpoint's
    own directory is then removed, as Ray's ``delete_local_checkpoint_after_upload`` does."""
    _remove_stale_staging()
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


def delete_local(checkpoint: Checkpoint) -> None:
    """Delete a local checkpoint directory (a ``TemporaryDirectory`` tolerates it gone)."""
    if checkpoint.is_local:
        shutil.rmtree(checkpoint.path, ignore_errors=True)


def _remove_stale_staging() -> None:
    """Remove staging directories of rank processes that are gone (killed mid-upload)."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            match = _STAGING_DIR.match(name)
            if match and not psutil.pid_exists(int(match.group(1))):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
