#!/usr/bin/env python3
"""Bring a service's database to the schema of the installed Prefect or MLflow, once, before the
service starts (its container's command runs this first).

    python /app/docker/migrate.py prefect && exec prefect server start ...
    python /app/docker/migrate.py mlflow && exec mlflow server ...  # the store and the users

``prefect``: Prefect's database, ``prefect server database upgrade`` (the server then starts
with ``PREFECT_API_DATABASE_MIGRATE_ON_START=false``). ``mlflow``: MLflow's tracking store and
registry (``$MLFLOW_BACKEND_STORE_URI``) and its basic-auth users (the ``database_uri`` of
``$MLFLOW_AUTH_CONFIG_PATH``): MLflow's own store classes create a new schema or upgrade an
older one. Run in the service's own container after PostgreSQL accepts queries, a migration
never races the service it is for (podman-compose ignores ``depends_on`` conditions, so a
separate one-shot service could not be waited for). Run again, each finds its schema current
and changes nothing. Each step names itself when it fails, and the command exits non-zero:
the service does not start. A step that cannot reach its database (a connection refused or
timed out, PostgreSQL starting up: a busy host after ``up``) is tried again for
``$CIFAR_MIGRATE_PATIENCE_S`` (default 180 s) before it fails: under a CPU hog, a start failed
that way in 1 of 30 ``down``/``up`` cycles and the container restarted.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import time
from collections.abc import Callable

# what a database that is not reachable yet looks like (asyncpg, psycopg2, the OS)
UNREACHABLE = (
    "TimeoutError",
    "timeout expired",
    "Connection refused",
    "ConnectionRefusedError",
    "CannotConnectNowError",
    "the database system is starting up",
    "the database system is shutting down",
)


def prefect() -> None:
    upgrade = [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"]
    subprocess.run(upgrade, check=True, capture_output=True)


def mlflow_tracking(uri: str) -> None:
    from mlflow.store.model_registry.sqlalchemy_store import (
        SqlAlchemyStore as RegistryStore,
    )
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(uri, "/tmp/unused-artifact-root")  # creates or upgrades the schema
    RegistryStore(uri)


def mlflow_auth(config_path: str) -> None:
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    config = configparser.ConfigParser()
    config.read(config_path)
    SqlAlchemyStore().init_db(config["mlflow"]["database_uri"])


def main(argv: list[str]) -> None:
    environ = os.environ
    services = {
        "prefect": [("Prefect's database", prefect)],
        "mlflow": [
            (
                "MLflow's tracking store",
                lambda: mlflow_tracking(environ["MLFLOW_BACKEND_STORE_URI"]),
            ),
            ("MLflow's users", lambda: mlflow_auth(environ["MLFLOW_AUTH_CONFIG_PATH"])),
        ],
    }
    if not argv or any(a not in services for a in argv):
        sys.exit(f"usage: migrate.py {' | '.join(services)} ...")
    steps = [step for service in argv for step in services[service]]
    patience_s = float(environ.get("CIFAR_MIGRATE_PATIENCE_S", "180"))
    for name, step in steps:
        deadline, wait_s = time.monotonic() + patience_s, 5.0
        while (why := _failure(step)) is not None:
            if not any(sign in why for sign in UNREACHABLE) or time.monotonic() > deadline:
                sys.exit(f"migrate: {name} could not be migrated: {why}")
            print(
                f"migrate: {name}: database not reachable yet ({why}); trying again in "
                f"{wait_s:.0f} s",
                flush=True,
            )
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, 30.0)
        print(f"migrate: {name} is current", flush=True)


def _failure(step: Callable[[], None]) -> str | None:
    """Why ``step`` failed, in one line, or None when it succeeded."""
    try:
        step()
    except subprocess.CalledProcessError as error:
        last = (error.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
        return " ".join(last) or str(error)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
