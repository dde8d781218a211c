"""The state of the training function running in one rank process."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from trainlib._internal.common.messages import (
    CheckpointsAnswer,
    Command,
    DataBlock,
    DataRequest,
    PreemptionNotice,
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
        self._blocks: defaultdict[str, queue.Queue[Any]] = defaultdict(queue.Queue)
        self.answers: queue.Queue[CheckpointsAnswer] = queue.Queue()  # to CheckpointsQuery
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
            self._blocks[message.dataset].put((message.pass_id, message.block))
        elif isinstance(message, CheckpointsAnswer):
            self.answers.put(message)
        elif isinstance(message, PreemptionNotice):
            self.preemption = message.info
        else:
            self.commands.put(message)

    def inbox(self, dataset: str) -> queue.Queue[Any]:
        """The blocks filed for ``dataset``, as ``(pass_id, block)``."""
        return self._blocks[dataset]
