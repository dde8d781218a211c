"""How a command runs a flow locally: the environment, Prefect's temporary server started while
the flow is imported, the console, the exit status."""

from __future__ import annotations

import contextlib
import gc
import json
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
ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib,cifar,tasks",  # rank 0's lines reach the flow
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # records of Dask's threads
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",  # a busy 2-core machine
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DASK_LOGGING__DISTRIBUTED": "warning",  # read when distributed is imported (in a task)
}


def set_environment() -> None:
    """The settings above, where the user has not set them."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def start_local_server() -> LocalPrefectServer | None:
    """Prefect's temporary server, started now (None: PREFECT_API_URL names the user's)."""
    from cli.local_server import LocalPrefectServer

    return LocalPrefectServer.start()


def use(server: LocalPrefectServer | None) -> None:
    """Point this process's Prefect client at ``server`` once it answers."""
    if server is not None:
        server.use()


def use_while_preparing_mlflow(server: LocalPrefectServer | None, tracking_uri: str | None) -> None:
    """Wait for Prefect's server while MLflow work the flow would do later, competing for the
    cores, is done: a new sqlite store is created (the flow then finds it made), and the model
    requirements are checked (MLflow's first model save in a process does it)."""
    from mlops.registry import check_requirements
    from mlops.tracking import create_sqlite_store, resolve_tracking_uri

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
        use(server)
    finally:
        made.wait()


def make_synthetic_archive(storage_path: str | None) -> tuple[str, str]:
    """Write a synthetic CIFAR-10 archive (``DEMO`` difficulty) under ``storage_path``; return
    its URL and md5."""
    import fsspec

    from cifar.format import DEMO, write_synthetic_archive
    from tasks.layout import StorageLayout

    target = StorageLayout.at(storage_path).synthetic_archive
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "cifar-10-python.tar.gz")
        md5 = write_synthetic_archive(
            local, images_per_batch=SYNTHETIC_IMAGES_PER_BATCH, difficulty=DEMO
        )
        fs, path = fsspec.core.url_to_fs(target)
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        fs.put_file(local, path)
    return fs.unstrip_protocol(path), md5


def run_command(
    command: str,
    run: Callable[[], dict[str, Any]],
    *,
    log_file: str,
    debug: bool,
    exits: bool,
) -> int:
    """Run a flow: its summary as JSON on stdout, or one paragraph per error on stderr.

    Returns the exit status (0, 1 after an error, 130 after Ctrl-C). ``exits``: the process
    ends with the command (run from the command line, not called).
    """
    from cli.console import console_logging, explain

    log_path = Path(log_file).resolve()
    try:
        with console_logging(log_path, debug=debug):
            try:
                summary = run()
            except (Exception, KeyboardInterrupt) as error:
                if debug:
                    traceback.print_exception(error)
                print(f"\n{explain(error, log_path, command)}", file=sys.stderr)
                return EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_FAILED
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        if exits:
            # Python's last garbage collection at exit walks the whole heap (torch, Prefect,
            # MLflow): 2.2 s here, 0.45 s with the heap frozen (benchmarks/cli_exit.py).
            gc.freeze()
