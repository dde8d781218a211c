"""A Dask worker in a SLURM job that SLURM preempts retires gracefully before it closes.

The ``dask worker`` command closes its nanny on SIGTERM, and a nanny tears its plugins down
before it stops its worker: this plugin's teardown, when SLURM is preempting the job
(``common.preemption_signal``), asks the scheduler to retire the worker (its data moved, its
status ``closing_gracefully``), which the driver counts as a preemption
(``FailureConfig(max_preemption_failures=)``, ``get_preemption_info``). The worker process
itself ignores that SIGTERM (``IgnorePreemptionSignal``) so that it is still there to retire,
and so do its fork server and ranks (``rank.rank_main``). Outside a SLURM job neither plugin
does anything; inside one, a nanny closing for any reason first asks ``scontrol`` (at most
5 s) whether the job is being preempted. A ``dask worker --no-nanny`` is left as it is (its
SIGTERM closes it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

from trainlib._internal.common.preemption_signal import (
    JOB_VARIABLE,
    ignore_sigterm_while_preempting,
    in_slurm_job,
    preempting,
)
from trainlib._internal.common.scheduler_rpc import retire_from_nanny

logger = logging.getLogger(__name__)
PLUGIN_NAME = "trainlib-preemption-retirement"
_RETIRE_TIMEOUT_S = 20.0


def register(client: Any) -> None:
    """Put both plugins on the client's cluster (its nannies and workers, and any that join)."""
    client.register_plugin(IgnorePreemptionSignal())
    client.register_plugin(PreemptionRetirement())


class IgnorePreemptionSignal(WorkerPlugin):
    """In a worker process of a SLURM job: ignore the SIGTERM of the job's preemption."""

    name = "trainlib-ignore-preemption-signal"
    idempotent = True

    def setup(self, worker: Any) -> None:
        if getattr(worker, "nanny", None) is None:
            return  # `dask worker --no-nanny`: its own SIGTERM handler closes it, as before
        ignore_sigterm_while_preempting()  # no-op outside a SLURM job or the main thread


class PreemptionRetirement(NannyPlugin):
    """Retires the nanny's worker gracefully when it closes because SLURM preempts its job."""

    name = PLUGIN_NAME
    idempotent = True  # registered by every run: keep the first

    async def teardown(self, nanny: Any) -> None:
        address = getattr(nanny, "worker_address", None)
        if address is None or not in_slurm_job() or not await asyncio.to_thread(preempting):
            return
        logger.info(
            "SLURM is preempting job %s: retiring Dask worker %s gracefully",
            os.environ[JOB_VARIABLE],
            address,
        )
        retiring = retire_from_nanny(nanny, address, f"slurm-preemption-{time.time()}")
        try:  # within SLURM's KillWait (30 s by default), so the nanny still stops its worker
            await asyncio.wait_for(retiring, _RETIRE_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning(
                "Dask worker %s did not retire within %.0f s", address, _RETIRE_TIMEOUT_S
            )
