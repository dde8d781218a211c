"""Batch jobs of a job-queue cluster (dask-jobqueue): which have no Dask worker yet, and why.

dask-jobqueue starts Dask workers as batch jobs (``sbatch`` for SLURM), which can wait in the
queue for a long time. A wait for workers that times out names those jobs and, for SLURM, the
state and reason ``squeue`` gives (``PENDING (Resources)``), instead of just "not enough
workers". The cluster's jobs are found by duck typing (each entry of ``cluster.workers`` is a
job with a ``job_id``), so dask_jobqueue is never imported here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from typing import Any

_SQUEUE_TIMEOUT_S = 10.0


def waiting_jobs(cluster: Any, connected_names: Iterable[str]) -> str:
    """The cluster's batch jobs none of whose workers has connected, described for a person
    (``"SLURM job 12 PENDING (Resources)"``); ``""`` if the cluster has no batch jobs."""
    names = [str(name) for name in connected_names]
    jobs = [
        (str(job.job_id), getattr(job, "submit_command", ""))
        for spec_name, job in dict(getattr(cluster, "workers", {})).items()
        if getattr(job, "job_id", None) and not _connected(str(spec_name), names)
    ]
    if not jobs:
        return ""
    ids = [job_id for job_id, _ in jobs]
    if all(command.split()[-1:] == ["sbatch"] for _, command in jobs if command):
        return _slurm_states(ids)
    return f"batch jobs {', '.join(ids)} (submitted, no Dask worker connected yet)"


def _connected(job_name: str, names: list[str]) -> bool:
    """A job named ``job_name`` runs worker ``job_name`` or, with several processes per
    job, ``job_name-0``, ``job_name-1``..."""
    return any(name == job_name or name.startswith(f"{job_name}-") for name in names)


def _slurm_states(ids: list[str]) -> str:
    described = {job_id: "not in squeue (ended; see its job log)" for job_id in ids}
    try:
        done = subprocess.run(
            ["squeue", "--noheader", "--format=%i|%T|%r", f"--jobs={','.join(ids)}"],
            capture_output=True,
            text=True,
            timeout=_SQUEUE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SLURM jobs {', '.join(ids)} (squeue failed: {exc})"
    for line in done.stdout.splitlines():
        job_id, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job_id in described:
            if state == "RUNNING":
                described[job_id] = "RUNNING, its Dask worker not connected (see its job log)"
            else:
                described[job_id] = f"{state} ({reason})" if reason else state
    return "; ".join(f"SLURM job {job_id} {what}" for job_id, what in described.items())
