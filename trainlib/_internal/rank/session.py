"""The state of the training function running in one rank process."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from trainlib._internal.common.messages import REPORTED_CHECKPOINTS, Command, RankSpec
from trainlib._internal.rank.uploads import Uploads
from trainlib.preemption import PREEMPTION, PreemptionInfo


class Session:
    """One rank's connection to its supervisor plus what ``report()`` needs."""

    def __init__(self, spec: RankSpec, send: Callable[[tuple[str, Any]], None]) -> None:
        self.spec = spec
        self._send = send
        self._lock = threading.Lock()
        self._inboxes: defaultdict[str, queue.Queue[Any]] = defaultdict(queue.Queue)
        self.commands: queue.Queue[Command] = queue.Queue()  # a live group's, in order
        self.next_index = spec.start_index
        self.uploads = Uploads(lambda message: self.send("report", message))
        self.preemption: PreemptionInfo | None = None  # the driver's latest notice

    def send(self, kind: str, payload: Any) -> None:
        """Send one message to the supervisor (thread-safe)."""
        self.send_message((kind, payload))

    def send_message(self, message: tuple[str, Any]) -> None:
        """Send one ``(kind, payload)`` message (thread-safe: never interleaved with another)."""
        with self._lock:
            self._send(message)

    def deliver(self, kind: str, payload: Any) -> None:
        """File a message from the supervisor (a block of a dataset, a command) for whoever
        waits on it."""
        if kind == "data":
            name, *rest = payload
            self._inboxes[name].put(tuple(rest))
        elif kind == "command" and payload.kind == REPORTED_CHECKPOINTS:
            self._inboxes[REPORTED_CHECKPOINTS].put(payload.payload)
        elif kind == "command" and payload.kind == PREEMPTION:
            self.preemption = payload.payload
        elif kind == "command":
            self.commands.put(payload)

    def inbox(self, name: str) -> queue.Queue[Any]:
        """The messages filed for dataset ``name`` (or the driver's ``REPORTED_CHECKPOINTS``)."""
        return self._inboxes[name]
