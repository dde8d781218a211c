"""SLURM start-up latencies on the one-node test cluster (tests/slurm_rig.py).

Printed: the daemons' start until the node is idle; ``sbatch`` until the job is RUNNING
(``squeue``); ``SLURMCluster.scale(2)`` until 2 Dask workers are registered; ``close()`` until
``squeue`` is empty. Each is measured ``--repeat`` times (median, min, max). Needs root and
``slurm-wlm`` + ``munge`` (``apt-get install -y slurm-wlm munge``) and the ``[slurm]`` extra.

Run: python benchmarks/slurm_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.slurm_rig import SlurmCluster, slurm_cluster


def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


def _summary(name: str, values: list[float]) -> None:
    print(
        f"{name:42s} median {statistics.median(values):6.2f} s  "
        f"min {min(values):6.2f}  max {max(values):6.2f}  (n={len(values)})"
    )


def _sbatch_to_running(slurm: SlurmCluster) -> float:
    job = slurm.command(
        "sbatch", "--parsable", "--output=/dev/null", "-c", "1", "--mem=100", "--wrap", "sleep 60"
    )
    job = job.strip()
    began = time.monotonic()
    _until(lambda: any(j == job and s == "RUNNING" for j, s, _ in slurm.jobs()))
    took = time.monotonic() - began
    slurm.command("scancel", job)
    _until(lambda: not slurm.jobs())
    return took


def _dask_workers(root: Path) -> tuple[float, float]:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    with (
        SLURMCluster(
            cores=1,
            processes=1,
            memory="1GB",
            walltime="00:10:00",
            interface="lo",
            local_directory=str(root / "dask"),
            log_directory=str(root / "jobs"),
        ) as cluster,
        Client(cluster) as client,
    ):
        began = time.monotonic()
        cluster.scale(2)
        client.wait_for_workers(2, timeout=120)
        up = time.monotonic() - began
    began = time.monotonic()
    return up, began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    daemons, sbatch, workers, cancel = [], [], [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            began = time.monotonic()
            with slurm_cluster(Path(tmp)) as slurm:
                daemons.append(time.monotonic() - began)
                os.environ.update(slurm.env)
                sbatch.append(_sbatch_to_running(slurm))
                up, closed_at = _dask_workers(Path(tmp))
                workers.append(up)
                _until(lambda: not slurm.jobs())
                cancel.append(time.monotonic() - closed_at)
    _summary("daemons started, node idle", daemons)
    _summary("sbatch -> RUNNING", sbatch)
    _summary("SLURMCluster.scale(2) -> 2 Dask workers", workers)
    _summary("close() returned -> squeue empty", cancel)


if __name__ == "__main__":
    main()
