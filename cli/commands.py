"""The ``train-cifar``, ``tune-cifar`` and ``predict-cifar`` commands: run the flows locally
with embedded defaults.

Prefect runs in its local (ephemeral) mode unless PREFECT_API_URL is set, the Dask cluster is
a LocalCluster, MLflow is a sqlite file in the current directory, storage is a local folder.
``predict-cifar`` scores images with a registered model the same way. A failure prints one
paragraph (what failed, why, what to do) and exits non-zero; the full trace goes to
``train-cifar.log`` / ``predict-cifar.log`` (and to the terminal with ``--debug``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import json
import logging
import os
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cli.local_server import LocalPrefectServer

SYNTHETIC_IMAGES_PER_BATCH = 1000
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

# Set before Prefect is imported: offline-safe, quiet, and logging the run's own lines.
_ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib,cifar,tasks",  # rank 0's lines reach the flow's logs
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # records of Dask's threads
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",  # a busy 2-core machine
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DASK_LOGGING__DISTRIBUTED": "warning",  # read when distributed is imported (in a task)
}


def _parser() -> argparse.ArgumentParser:
    """train-cifar's options; one not given is left out (the flow's default applies)."""
    parser = argparse.ArgumentParser(
        prog="train-cifar",
        description="Train, register, evaluate and promote a CIFAR-10 classifier "
        "(the Prefect flow train-cifar, run locally).",
        argument_default=argparse.SUPPRESS,
    )
    add = parser.add_argument
    add("--data-url", help="archive URL: https://, s3://, file://")
    add(
        "--data-md5",
        help="expected md5 (default: the official one for the official URL; none otherwise)",
    )
    add(
        "--synthetic",
        action="store_true",
        help="build a synthetic archive in the CIFAR-10 format (offline machines, CI) and use it",
    )
    add("--storage-path", help="local folder or s3:// URL")
    add("--model", help="small_cnn (fast on CPU) or resnet18")
    add("--epochs", type=int)
    add("--batch-size", type=int, help="global batch size")
    add("--lr", type=float, help="peak learning rate (one-cycle)")
    add("--num-workers", type=int, help="DDP ranks")
    add("--use-gpu", action="store_true", help="one GPU per rank, NCCL, bf16 autocast")
    add("--compile", action="store_true", help="torch.compile the model on every rank")
    add(
        "--dask-cluster-class",
        help="cluster class to start, e.g. dask_jobqueue.SLURMCluster",
    )
    add(
        "--dask-cluster-kwargs",
        type=json.loads,
        help='its keyword arguments as JSON, e.g. \'{"cores": 8, "memory": "32GB"}\'',
    )
    add(
        "--dask-address",
        help="scheduler of an existing Dask cluster (default: $DASK_SCHEDULER_ADDRESS, "
        "else a LocalCluster)",
    )
    add(
        "--dask-worker-timeout-s",
        type=float,
        help="how long to wait for enough Dask workers",
    )
    add(
        "--mlflow-tracking-uri",
        help="MLflow server or store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    add("--registered-model-name")
    add(
        "--promote-margin",
        type=float,
        help="accuracy a new model must beat the champion by",
    )
    add("--predict-input", help="images to score with the champion afterwards")
    add(
        "--run-name",
        help="name of the training run; the same name and storage path resume it",
    )
    add("--shard-size", type=int, help="images per dataset file")
    add("--debug", action="store_true", help="print full tracebacks of errors")
    return parser


def make_synthetic_archive(storage_path: str) -> tuple[str, str]:
    """Write a synthetic CIFAR-10 archive under ``storage_path``; return its URL and md5."""
    import fsspec

    from cifar.format import write_synthetic_archive
    from cifar.layout import StorageLayout

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
    _set_environment()
    given = vars(_parser().parse_args(argv))  # before anything starts: a typo fails at once
    synthetic, debug = given.pop("synthetic", False), given.pop("debug", False)
    server = _local_server(argv)  # its start-up overlaps the imports below
    from flows.train_cifar import train_cifar

    params = _flow_defaults(train_cifar.fn) | given

    def run() -> dict[str, Any]:
        if synthetic:
            params["data_url"], params["data_md5"] = make_synthetic_archive(params["storage_path"])
            logging.getLogger("train-cifar").warning(
                "SYNTHETIC DATA: training on a generated archive in the CIFAR-10 format (%s), "
                "not on CIFAR-10; accuracies say nothing about real images.",
                params["data_url"],
            )
        _meanwhile(server, params["mlflow_tracking_uri"])
        return train_cifar(**params)

    return _run_command("train-cifar", run, debug=debug, exits=argv is None)


def tune_main(argv: list[str] | None = None) -> int:
    """Run tune-cifar (the flow, locally); returns the exit status as ``main`` does."""
    _set_environment()
    parser = argparse.ArgumentParser(
        prog="tune-cifar",
        description="Search hyperparameters of a CIFAR-10 classifier, then register, evaluate "
        "and promote the best trial (the Prefect flow tune-cifar, run locally).",
        argument_default=argparse.SUPPRESS,  # one not given: the flow's default applies
    )
    add = parser.add_argument
    add("--data-url", help="archive URL: https://, s3://, file://")
    add("--data-md5", help="expected md5 (default: the official one, if official)")
    add("--synthetic", action="store_true", help="train on a synthetic CIFAR-10-format archive")
    add("--storage-path", help="local folder or s3:// URL")
    add(
        "--search-space",
        type=json.loads,
        help='JSON, e.g. \'{"lr": ["loguniform", 0.01, 0.3], "batch_size": ["choice", [128]]}\'',
    )
    add("--num-samples", type=int, help="trials")
    add("--max-concurrent-trials", type=int)
    add("--epochs", type=int, help="epochs of a full trial")
    add("--num-workers", type=int, help="ranks per trial")
    add("--dask-address", help="scheduler of an existing Dask cluster")
    add("--mlflow-tracking-uri", help="MLflow server or store")
    add("--registered-model-name")
    add("--promote-margin", type=float)
    add("--name", help="name of the search; the same name and storage resume it")
    add(
        "--study-storage",
        help="Optuna storage URL, e.g. postgresql://... (default: sqlite under --storage-path; "
        "needed with s3:// storage)",
    )
    add("--debug", action="store_true", help="print full tracebacks of errors")
    given = vars(parser.parse_args(argv))  # before anything starts: a typo fails at once
    synthetic, debug = given.pop("synthetic", False), given.pop("debug", False)
    server = _local_server(argv)
    from flows.tune_cifar import tune_cifar

    params = _flow_defaults(tune_cifar.fn) | given

    def run() -> dict[str, Any]:
        if synthetic:
            params["data_url"], params["data_md5"] = make_synthetic_archive(params["storage_path"])
            logging.getLogger("tune-cifar").warning(
                "SYNTHETIC DATA: searching on a generated archive in the CIFAR-10 format (%s).",
                params["data_url"],
            )
        _meanwhile(server, params["mlflow_tracking_uri"])
        return tune_cifar(**params)

    return _run_command("tune-cifar", run, debug=debug, exits=argv is None)


def predict_main(argv: list[str] | None = None) -> int:
    """Run predict-cifar (the flow, locally); returns the exit status as ``main`` does."""
    _set_environment()
    server = _local_server(argv)
    from flows.predict_cifar import predict_cifar
    from tasks.registry import CHAMPION

    parser = argparse.ArgumentParser(
        prog="predict-cifar",
        description="Score images with a registered CIFAR-10 classifier (the Prefect flow "
        "predict-cifar, run locally). Unreadable images go to OUTPUT's .errors.csv.",
    )
    add = parser.add_argument
    add("input", help="a folder of PNG/JPEG images, one image, or a CIFAR batch file (any URL)")
    add("--output", default="predictions.csv", help="CSV, or Parquet if it ends in .parquet")
    add("--model-name", default="cifar10-classifier", help="registered model")
    add("--alias", default=CHAMPION, help="the model's alias to score with")
    add(
        "--mlflow-tracking-uri",
        default=None,
        help="MLflow server or store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    add("--debug", action="store_true", help="print full tracebacks of errors")
    args = parser.parse_args(argv)

    def run() -> dict[str, Any]:
        _use(server)
        return predict_cifar(
            args.input, args.output, args.model_name, args.alias, args.mlflow_tracking_uri
        )

    return _run_command("predict-cifar", run, debug=args.debug, exits=argv is None)


def _local_server(argv: list[str] | None) -> LocalPrefectServer | None:
    """Prefect's temporary server, started now (None: a server of the user's, or only --help)."""
    from cli.local_server import LocalPrefectServer

    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        return None  # only the usage is printed: no flow runs
    return LocalPrefectServer.start()


def _use(server: LocalPrefectServer | None) -> None:
    if server is not None:
        server.use()


def _meanwhile(server: LocalPrefectServer | None, tracking_uri: str | None) -> None:
    """Wait for Prefect's server while MLflow work the flow would do later, competing for the
    cores, is done: a new sqlite store is created (the flow then finds it made), and the model
    requirements are checked (MLflow's first model save in a process does it)."""
    from tasks.registry import check_requirements
    from tasks.tracking import create_sqlite_store, resolve_tracking_uri

    def create() -> None:
        try:
            with contextlib.suppress(Exception):  # the flow's own step meets it again, says so
                create_sqlite_store(resolve_tracking_uri(tracking_uri))
        finally:
            made.set()
        with contextlib.suppress(Exception):  # the registration does it again
            check_requirements()

    made = threading.Event()  # the flow waits for the store, not for the check
    threading.Thread(target=create, name="mlflow-ahead", daemon=True).start()
    try:
        _use(server)
    finally:
        made.wait()


def _flow_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def _set_environment() -> None:
    for key, value in _ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def _run_command(
    command: str, run: Callable[[], dict[str, Any]], *, debug: bool, exits: bool
) -> int:
    """Run a flow: its summary as JSON on stdout, or one paragraph per error on stderr.

    ``exits``: the process ends with the command (run from the command line, not called).
    """
    from cli.console import console_logging, explain

    log_file = Path(f"{command}.log").resolve()
    try:
        with console_logging(log_file, debug=debug):
            try:
                summary = run()
            except (Exception, KeyboardInterrupt) as error:
                if debug:
                    traceback.print_exception(error)
                print(f"\n{explain(error, log_file, command)}", file=sys.stderr)
                return EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_FAILED
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        if exits:
            # Python's last garbage collection at exit walks the whole heap (torch, Prefect,
            # MLflow): 2.2 s here, 0.45 s with the heap frozen (benchmarks/cli_exit.py).
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
