"""Which failures of a pipeline step are worth a retry, and for how long: storage or a server
out of reach (``mlops.outages.is_transient``), never a bad input, within the outage a run rides
through (``mlops.outages.outage_tolerance_s``, 15 minutes by default) since the step began.

The steps that read or write storage or the registry retry with Prefect's own task retries:
``@task(..., **TRANSIENT_RETRIES)``. Each try of an MLflow call already waits through MLflow's
own HTTP retries (about 4 minutes when the server does not answer).
"""

from __future__ import annotations

import time
from typing import Any

from mlops.outages import is_transient, outage_tolerance_s

RETRIES = 50  # Prefect's most; the time bound below ends them first
RETRY_DELAYS_S = [2.0, 10.0, 30.0, 60.0]  # the last repeats


def transient_failure(task: object, task_run: Any, state: Any) -> bool:
    """A Prefect ``retry_condition_fn``: retry the task after a transient failure while the
    step has been running for less than the outage tolerance."""
    try:
        state.result()
    except Exception as error:
        if not is_transient(error):
            return False
        started = getattr(task_run, "start_time", None)
        return started is None or time.time() - started.timestamp() < outage_tolerance_s()
    return False


TRANSIENT_RETRIES: dict[str, Any] = {
    "retries": RETRIES,
    "retry_delay_seconds": RETRY_DELAYS_S,
    "retry_condition_fn": transient_failure,
}
