"""One publication at a time per registered model, in the order MLflow numbered its versions.

Two publishers of one model judged at once would read the same ledger (the same place in the
model's error budget: its alpha spent twice) and the same champion. MLflow numbers a model's
versions atomically, so the numbers are the queue, kept in the registry itself: a version is
judged only once every earlier version of the model has settled (``registry.settled``: it holds
an alias, its decision is recorded, or it was withdrawn). An earlier version whose flow run
ended without settling it (its process was killed) is withdrawn, as the sweep does; one whose
flow run cannot be asked about (the Prefect server is down) is waited for, so an outage of any
length never lets two publishers through together (there is no lease to lapse). Later versions
never hold up earlier ones: no deadlock, and each waits its turn. No Prefect here: the caller
says which flow runs are still going.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mlflow.tracking import MlflowClient

from mlops.registry import settled, withdraw_version
from mlops.version_tags import REQUEST_TAG

logger = logging.getLogger(__name__)

POLL_S = 2.0
TIMEOUT_S = 3600.0  # an evaluation ahead of this one takes minutes; an hour is something wrong


class QueueTimeout(RuntimeError):
    """Earlier versions of the model were still being published after the wait's limit."""


def wait_for_turn(
    model_name: str,
    version: str,
    tracking_uri: str,
    own_request: str | None,
    in_progress: Callable[[str], bool],
    timeout_s: float = TIMEOUT_S,
    poll: Callable[[], None] = lambda: time.sleep(POLL_S),
) -> None:
    """Return once every version of ``model_name`` before ``version`` has settled (those of
    flow runs that ended unsettled are withdrawn on the way). ``in_progress(flow_run_id)``
    says whether a flow run is still going; when it raises (Prefect cannot be asked), the run
    counts as going. ``own_request``: this flow run, whose own versions never hold it up.

    Raises:
        QueueTimeout: After ``timeout_s``, naming the versions ahead and their flow runs.
    """
    client = MlflowClient(tracking_uri)
    deadline = time.monotonic() + timeout_s
    while True:
        going = [
            (number, request)
            for number, request in _unsettled_before(client, model_name, int(version))
            if (request is None or request != own_request)
            and not _out_of_the_way(client, model_name, number, request, in_progress)
        ]
        if not going:
            return
        if time.monotonic() >= deadline:
            listed = ", ".join(f"version {n} (flow run {r or 'unknown'})" for n, r in going)
            raise QueueTimeout(
                f"version {version} of {model_name!r} waited {timeout_s:.0f} s for earlier "
                f"versions to finish publishing: {listed}. Let those flow runs finish or cancel "
                "them (a cancelled run's version is withdrawn at the next publish), then run "
                "this flow again."
            )
        poll()


def _unsettled_before(
    client: MlflowClient, model_name: str, version: int
) -> list[tuple[int, str | None]]:
    """The versions of ``model_name`` before ``version`` that have not settled, with the flow
    run that registered each."""
    found = []
    for candidate in client.search_model_versions(f"name='{model_name}'"):
        number = int(candidate.version)
        tags = dict(candidate.tags or {})
        if number >= version or settled(tags, []):
            continue
        full = client.get_model_version(model_name, str(number))  # search omits aliases
        if not settled(dict(full.tags or {}), list(full.aliases or [])):
            found.append((number, tags.get(REQUEST_TAG)))
    return sorted(found)


def _out_of_the_way(
    client: MlflowClient,
    model_name: str,
    number: int,
    request: str | None,
    in_progress: Callable[[str], bool],
) -> bool:
    """Whether version ``number`` is out of the way: its flow run ended without settling it
    (then it is withdrawn now), or it settled meanwhile. False while its run is going or
    cannot be asked about."""
    if request is not None:
        try:
            if in_progress(request):
                return False
        except Exception as error:  # Prefect cannot say: the run may be going, so wait
            logger.warning("cannot tell whether flow run %s is still going: %s", request, error)
            return False
    full = client.get_model_version(model_name, str(number))  # read again: it ended just now
    if settled(dict(full.tags or {}), list(full.aliases or [])):
        return True
    withdraw_version(
        model_name,
        str(number),
        client.tracking_uri,
        f"left by a publish that never finished (flow run {request or 'unknown'})",
    )
    return True
