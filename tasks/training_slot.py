"""One training at a time on the Dask cluster, held by the cluster's own scheduler.

Prefect's tag concurrency limit (``dask-training``, the stack's deploy step makes it) queues
the trainings of every deployment, but its slot is a lease the task renews through the Prefect
API, and Prefect's task engine carries on when a renewal fails: an API outage longer than the
lease (60 s) frees the slot while the training goes on. The slot that keeps two trainings off
the same workers is therefore a ``distributed.Semaphore`` on the cluster's scheduler, held by
the training's Dask client while it trains: it lives as long as the training does, whatever the
Prefect API does, and lapses about 30 s after its driver dies
(``distributed.scheduler.locks.lease-timeout``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Semaphore

from trainlib import DaskConfig

logger = logging.getLogger(__name__)

SLOTS_VARIABLE = "CIFAR_TRAINING_SLOTS"  # the worker's: as many as the tag limit's slots
SEMAPHORE = "cifar-training"
WAIT_LOG_S = 60.0


def training_slots() -> int:
    """How many trainings the cluster takes at once: ``$CIFAR_TRAINING_SLOTS``, else 1."""
    configured = os.environ.get(SLOTS_VARIABLE, "1")
    if not configured.isdigit() or int(configured) < 1:
        raise ValueError(
            f"{SLOTS_VARIABLE}={configured!r} must be a whole number of trainings, 1 or more; "
            "fix the worker's environment"
        )
    return int(configured)


@contextmanager
def training_slot(dask_config: DaskConfig, run_name: str) -> Iterator[None]:
    """Hold one of the cluster's training slots while the block runs; wait for one first
    (saying so every minute). ``dask_config`` names the running cluster (``attached_to``)."""
    with dask_config.connect() as client:
        semaphore = Semaphore(
            max_leases=training_slots(),
            name=SEMAPHORE,
            scheduler_rpc=client.scheduler,
            loop=client.loop,
        )
        started = time.monotonic()
        while not semaphore.acquire(timeout=WAIT_LOG_S):
            logger.warning(
                "Training %s waits for the cluster's training slot (another training holds "
                "it; %.0f s so far)",
                run_name,
                time.monotonic() - started,
            )
        try:
            yield
        finally:
            semaphore.release()
            if (refresh := getattr(semaphore, "refresh_callback", None)) is not None:
                refresh.stop()  # (close() would delete the semaphore for every client)
