"""The train-cifar flow's overhead beyond the training step itself.

Runs the whole flow several times on a synthetic archive that is already on storage (download
verifies and skips it; preprocessing runs in full on a fresh storage folder each time) and
subtracts the training step (the sum of the epochs' ``epoch_time_s`` reported by rank 0) from
the flow's wall time. What is left is Prefect, MLflow (run, model logging, registry),
Dask cluster start, rank start-up, data tasks, evaluation and promotion.

The first flow call of the process also starts Prefect's temporary local server; it is
reported apart. Target: overhead <= 10 s.

Run: python benchmarks/flow_overhead.py [--runs 3] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    from mlflow.tracking import MlflowClient

    from cifar.format import write_synthetic_archive
    from flows.train_cifar import train_cifar

    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        archive = os.path.join(tmp, "cifar-10-python.tar.gz")
        md5 = write_synthetic_archive(archive, images_per_batch=1000)
        tracking_uri = f"sqlite:///{tmp}/mlflow.db"
        overheads, walls = [], []
        for run in range(args.runs + 1):
            storage = os.path.join(tmp, f"store{run}")
            os.makedirs(os.path.join(storage, "raw"))
            shutil.copy(archive, os.path.join(storage, "raw"))  # "already downloaded"
            started = time.perf_counter()
            summary = train_cifar(
                data_url=f"file://{archive}",
                data_md5=md5,
                storage_path=storage,
                epochs=args.epochs,
                mlflow_tracking_uri=tracking_uri,
            )
            wall = time.perf_counter() - started
            history = MlflowClient(tracking_uri).get_metric_history(
                summary["mlflow_run_id"], "epoch_time_s"
            )
            training = sum(m.value for m in history)
            label = "warm-up (starts Prefect's temporary server)" if run == 0 else f"run {run}"
            print(
                f"{label}: flow {wall:.1f} s, training step {training:.1f} s, "
                f"overhead {wall - training:.1f} s",
                flush=True,
            )
            if run:
                overheads.append(wall - training)
                walls.append(wall)
        print(
            f"\nmedian over {args.runs} runs: flow {statistics.median(walls):.1f} s, "
            f"overhead {statistics.median(overheads):.1f} s (target <= 10 s)"
        )


if __name__ == "__main__":
    main()
