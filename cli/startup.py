"""A command's start-up: Prefect's temporary server started first, so its start overlaps the
flow's imports, and MLflow's first work done while the server comes up."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cli.local_server import LocalPrefectServer


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
