"""Messages from the driver to its ranks (a live group's commands, the answer to a rank's
question, a preemption notice), relayed by their supervisors.

A supervisor registers its rank's connection under its group's token; the driver calls
``deliver`` on the group's workers (``Client.run``, which reaches a worker directly, without
scheduling a task), and each worker writes the message on its rank's socket. The rank files it
in its session by its type (``Session.deliver``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainlib._internal.common.messages import ToRank
from trainlib._internal.worker.process_globals import WORKER


def register(token: str, worker: str, send: Callable[[Any], None]) -> None:
    """Route commands for group ``token`` on ``worker`` to ``send``."""
    with WORKER.relay_lock:
        WORKER.command_routes[(token, worker)] = send


def unregister(token: str, worker: str) -> None:
    """Stop routing (the rank ended)."""
    with WORKER.relay_lock:
        WORKER.command_routes.pop((token, worker), None)


def deliver(token: str, message: ToRank, dask_worker: Any = None) -> bool:
    """Runs on a Dask worker: send ``message`` to the rank of group ``token`` there.

    Returns:
        False when that rank is gone (its supervisor has ended).
    """
    with WORKER.relay_lock:
        send = WORKER.command_routes.get((token, dask_worker.address))
    if send is None:
        return False
    try:
        send(message)
    except OSError:
        return False
    return True
