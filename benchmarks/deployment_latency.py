"""Latency of `prefect deployment run train-cifar/manual`: to the training step, to Completed.

Starts a Prefect server (on PostgreSQL, as the tests do) and a process worker (as in the README,
on a free port, worker polling every second), registers deployments/prefect.yaml, then runs
train-cifar/manual several times for one epoch on a synthetic archive served from disk. For
each run: seconds from the run request to the flow run's start (Running: the worker's poll, the
flow-run process, its imports), to the start of the `train` task, and to the flow run's end
(Completed).

Run: python benchmarks/deployment_latency.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, for tests.prefect_*


def _timings(flow_run_id: Any) -> tuple[Any, Any, Any]:
    from prefect.client.orchestration import get_client

    from tests.prefect_records import task_runs

    train = task_runs(flow_run_id, ["train"])["train"]  # once the server has recorded it

    async def read() -> Any:
        async with get_client() as client:
            return await client.read_flow_run(flow_run_id)

    run = asyncio.run(read())
    return run.start_time, train.start_time, run.end_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from cifar.format import write_synthetic_archive
    from tests.postgres_rig import postgres_server
    from tests.prefect_stack import deploy_all, prefect_stack

    with (
        tempfile.TemporaryDirectory() as tmp,
        postgres_server() as postgres,
        prefect_stack(Path(tmp), postgres.create_database("prefect")) as env,
    ):
        archive = os.path.join(tmp, "cifar-10-python.tar.gz")
        md5 = write_synthetic_archive(archive, images_per_batch=1000)
        deploy_all(env)
        to_running, to_train, to_done = [], [], []
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            for run in range(args.runs):
                requested = time.time()
                flow_run = run_deployment(
                    "train-cifar/manual",
                    timeout=600,
                    poll_interval=0.5,
                    parameters={
                        "data_url": f"file://{archive}",
                        "data_md5": md5,
                        "epochs": 1,
                        "storage_path": os.path.join(tmp, "store"),
                        "mlflow_tracking_uri": f"sqlite:///{tmp}/mlflow.db",
                    },
                )
                assert flow_run.state.is_completed(), flow_run.state
                running, train_start, end = _timings(flow_run.id)
                to_running.append(running.timestamp() - requested)
                to_train.append(train_start.timestamp() - requested)
                to_done.append(end.timestamp() - requested)
                print(
                    f"run {run + 1}: flow run Running after {to_running[-1]:.1f} s, "
                    f"training step starts after {to_train[-1]:.1f} s, "
                    f"Completed after {to_done[-1]:.1f} s",
                    flush=True,
                )
    print(
        f"\nmedian over {args.runs} runs: to Running {statistics.median(to_running):.1f} s, "
        f"to training step {statistics.median(to_train):.1f} s, "
        f"to Completed {statistics.median(to_done):.1f} s"
    )


if __name__ == "__main__":
    main()
