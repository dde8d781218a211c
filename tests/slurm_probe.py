"""A Dask worker preload for tests: records which tasks ran in which SLURM job.

Loaded by every Dask worker started while ``DASK_DISTRIBUTED__WORKER__PRELOAD`` names this
file and ``TRAINLIB_TEST_PROBE_DIR`` a folder: each task that finishes on the worker appends its
key to ``<folder>/<SLURM_JOB_ID or "no-job">-<pid>.keys``. It observes; it changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

PROBE_DIR = "TRAINLIB_TEST_PROBE_DIR"


class TaskProbe(WorkerPlugin):
    """Appends the key of every task that finished executing on this worker to a file."""

    name = "trainlib-test-probe"

    def __init__(self, folder: Path) -> None:
        job = os.environ.get("SLURM_JOB_ID", "no-job")
        self.path = folder / f"{job}-{os.getpid()}.keys"

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start == "executing" and finish == "memory":
            with open(self.path, "a") as out:
                out.write(f"{key}\n")


async def dask_setup(worker: Any) -> None:
    await worker.plugin_add(TaskProbe(Path(os.environ[PROBE_DIR])))


def tasks_by_job(folder: Path) -> dict[str, list[str]]:
    """Keys of the tasks recorded under ``folder``, by SLURM job id (``"no-job"`` outside)."""
    found: dict[str, list[str]] = {}
    for path in folder.glob("*.keys"):
        job = path.name.split("-", 1)[0]
        found.setdefault(job, []).extend(path.read_text().split())
    return found
