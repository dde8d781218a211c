#!/usr/bin/env python3
"""Bring the stack's databases to the schemas of the installed Prefect and MLflow, once, before
the services that use them start (the compose stack's one-shot ``migrate`` service).

    wait-for postgres://postgres:5432 -- python /app/docker/migrate.py

Prefect's database: ``prefect server database upgrade`` (the server then starts with
``PREFECT_API_DATABASE_MIGRATE_ON_START=false``). MLflow's tracking store and registry
(``$MLFLOW_BACKEND_STORE_URI``) and its basic-auth users (the ``database_uri`` of
``$MLFLOW_AUTH_CONFIG_PATH``): MLflow's own store classes create a new schema or upgrade an
older one. Run again, each finds its schema current and changes nothing. Each step names itself
when it fails, and the service exits non-zero: the services that wait for it do not start.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys


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


def main() -> None:
    steps = [
        ("Prefect's database", prefect),
        (
            "MLflow's tracking store",
            lambda: mlflow_tracking(os.environ["MLFLOW_BACKEND_STORE_URI"]),
        ),
        ("MLflow's users", lambda: mlflow_auth(os.environ["MLFLOW_AUTH_CONFIG_PATH"])),
    ]
    for name, step in steps:
        try:
            step()
        except subprocess.CalledProcessError as error:
            last = (error.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
            sys.exit(f"migrate: {name} could not be migrated: {' '.join(last) or error}")
        except Exception as error:
            sys.exit(f"migrate: {name} could not be migrated: {type(error).__name__}: {error}")
        print(f"migrate: {name} is current", flush=True)


if __name__ == "__main__":
    main()
