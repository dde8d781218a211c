"""The state of the training function running in one rank process."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from trainlib._internal.common.messages import (
    PREEMPTION,
    REPORTED_CHECKPOINTS,
    Command,
    DataBlock,
    DataRequest,
    RankMessage,
    RankSpec,
    ToRank,
)
from trainlib._internal.rank.uploads import Uploads
from trainlib.preemption import PreemptionInfo


class Session:
    """One rank's connection to its supervisor plus what ``report()`` needs."""

    def __init__(self, spec: RankSpec, send: Callable[[RankMessage], None]) -> None:
        self.spec = spec
        self._send = send
        self._lock = threading.Lock()
        self._inboxes: defaultdict[str, queue.Queue[Any]] = defaultdict(queue.Queue)
        self.commands: queue.Queue[Command] = queue.Queue()  # a live group's, in order
        self.next_index = spec.start_index
        self.uploads = Uploads(self.send)
        self.preemption: PreemptionInfo | None = None  # the driver's latest notice

    def send(self, message: RankMessage) -> None:
        """Send one message to the supervisor (thread-safe: never interleaved with another)."""
        with self._lock:
            self._send(message)

    def request_block(self, dataset: str, pass_id: int) -> None:
        """Ask the feeder for the next block of ``dataset`` in pass ``pass_id`` (it comes to
        ``inbox(dataset)`` as ``(pass_id, block)``)."""
        self.send(DataRequest(dataset, pass_id))

    def deliver(self, message: ToRank) -> None:
        """File a message from the supervisor (a block of a dataset, a command) for whoever
        waits on it."""
        if isinstance(message, DataBlock):
            self._inboxes[message.dataset].put((message.pass_id, message.block))
        elif message.kind == REPORTED_CHECKPOINTS:
            self._inboxes[REPORTED_CHECKPOINTS].put(message.payload)
        elif message.kind == PREEMPTION:
            self.preemption = message.payload
        else:
            self.commands.put(message)

    def inbox(self, name: str) -> queue.Queue[Any]:
        """The messages filed for dataset ``name`` (or the driver's ``REPORTED_CHECKPOINTS``)."""
        return self._inboxes[name]
