"""The ``train-cifar`` command: run the flow locally with embedded defaults.

Prefect runs in its local (ephemeral) mode unless PREFECT_API_URL is set, the Dask cluster is
a LocalCluster, MLflow is a sqlite file in the current directory, storage is a local folder.
A failure prints one paragraph (what failed, why, what to do) and exits non-zero; the full
trace goes to ``train-cifar.log`` (and to the terminal with ``--debug``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

SYNTHETIC_IMAGES_PER_BATCH = 1000
LOG_FILE = "train-cifar.log"
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

# Set before Prefect is imported: offline-safe, quiet, and logging the run's own lines.
_ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib,tasks",  # rank 0's lines reach the flow's logs
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # records of Dask's threads
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",  # a busy 2-core machine
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DASK_LOGGING__DISTRIBUTED": "warning",  # read when distributed is imported (in a task)
}


def _parser(defaults: dict[str, Any]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train-cifar",
        description="Train, register, evaluate and promote a CIFAR-10 classifier "
        "(the Prefect flow train-cifar, run locally).",
    )
    add = parser.add_argument
    add("--data-url", default=defaults["data_url"], help="archive URL: https://, s3://, file://")
    add(
        "--data-md5",
        default=None,
        help="expected md5 (default: the official one for the official URL; none otherwise)",
    )
    add(
        "--synthetic",
        action="store_true",
        help="build a synthetic archive in the CIFAR-10 format (offline machines, CI) and use it",
    )
    add("--storage-path", default=defaults["storage_path"], help="local folder or s3:// URL")
    add("--model", default=defaults["model"], help="small_cnn (fast on CPU) or resnet18")
    add("--epochs", type=int, default=defaults["epochs"])
    add("--batch-size", type=int, default=defaults["batch_size"], help="global batch size")
    add("--lr", type=float, default=defaults["lr"], help="peak learning rate (one-cycle)")
    add("--num-workers", type=int, default=defaults["num_workers"], help="DDP ranks")
    add("--use-gpu", action="store_true", help="one GPU per rank, NCCL, bf16 autocast")
    add(
        "--dask-cluster-class",
        default=None,
        help="cluster class to start, e.g. dask_jobqueue.SLURMCluster",
    )
    add(
        "--dask-cluster-kwargs",
        type=json.loads,
        default=None,
        help='its keyword arguments as JSON, e.g. \'{"cores": 8, "memory": "32GB"}\'',
    )
    add(
        "--dask-address",
        default=None,
        help="scheduler of an existing Dask cluster (default: $DASK_SCHEDULER_ADDRESS, "
        "else a LocalCluster)",
    )
    add(
        "--dask-worker-timeout-s",
        type=float,
        default=defaults["dask_worker_timeout_s"],
        help="how long to wait for enough Dask workers",
    )
    add(
        "--mlflow-tracking-uri",
        default=None,
        help="MLflow server or store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    add("--registered-model-name", default=defaults["registered_model_name"])
    add(
        "--promote-margin",
        type=float,
        default=defaults["promote_margin"],
        help="accuracy a new model must beat the champion by",
    )
    add("--predict-input", default=None, help="images to score with the champion afterwards")
    add(
        "--run-name",
        default=None,
        help="name of the training run; the same name and storage path resume it",
    )
    add("--shard-size", type=int, default=defaults["shard_size"], help="images per dataset file")
    add("--debug", action="store_true", help="print full tracebacks of errors")
    return parser


def make_synthetic_archive(storage_path: str) -> tuple[str, str]:
    """Write a synthetic CIFAR-10 archive under ``storage_path``; return its URL and md5."""
    import fsspec

    from tasks.cifar import write_synthetic_archive
    from tasks.layout import StorageLayout

    target = StorageLayout.at(storage_path).synthetic_archive
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "cifar-10-python.tar.gz")
        md5 = write_synthetic_archive(local, images_per_batch=SYNTHETIC_IMAGES_PER_BATCH)
        fs, path = fsspec.core.url_to_fs(target)
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        fs.put_file(local, path)
    return fs.unstrip_protocol(path), md5


def main(argv: list[str] | None = None) -> int:
    """Run train-cifar; returns the exit status (0, or 1 after an error, 130 after Ctrl-C)."""
    for key, value in _ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from flows.console import configure_logging, explain
    from flows.train_cifar import train_cifar

    defaults = {name: p.default for name, p in inspect.signature(train_cifar.fn).parameters.items()}
    args = _parser(defaults).parse_args(argv)
    log_file = Path(LOG_FILE).resolve()
    configure_logging(log_file, debug=args.debug)
    params = {k: v for k, v in vars(args).items() if k not in ("synthetic", "debug")}
    try:
        if args.synthetic:
            params["data_url"], params["data_md5"] = make_synthetic_archive(args.storage_path)
            logging.getLogger("train-cifar").warning(
                "SYNTHETIC DATA: training on a generated archive in the CIFAR-10 format (%s), "
                "not on CIFAR-10; accuracies say nothing about real images.",
                params["data_url"],
            )
        summary = train_cifar(**params)
    except (Exception, KeyboardInterrupt) as error:
        logging.getLogger("train-cifar").debug("train-cifar failed", exc_info=error)
        if args.debug:
            traceback.print_exception(error)
        print(f"\n{explain(error, log_file)}", file=sys.stderr)
        return EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_FAILED
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
