"""docker/migrate.py on a real PostgreSQL: new databases get every schema, and a second run
changes nothing; docker/wait_for.py waits for a server that accepts queries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import free_port
from tests.postgres_rig import Postgres

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "docker"))
import wait_for  # noqa: E402  (a script of the image, not a package)


def test_migrate_creates_every_schema_once_then_changes_nothing(
    postgres: Postgres, tmp_path: Path
) -> None:
    prefect, mlflow, auth = (postgres.create_database(n) for n in ("pf", "ml", "mlauth"))
    config = tmp_path / "auth.ini"
    config.write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = {auth}\nadmin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        **os.environ,
        "PREFECT_API_DATABASE_CONNECTION_URL": prefect.replace(
            "postgresql://", "postgresql+asyncpg://"
        ),
        "MLFLOW_BACKEND_STORE_URI": mlflow,
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "PREFECT_HOME": str(tmp_path),
    }
    runs = [
        subprocess.run(
            [sys.executable, "docker/migrate.py", "prefect", "mlflow"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr[-3000:]
    for name, database in (("prefect", "pf"), ("mlflow", "ml"), ("auth", "mlauth")):
        tables = postgres.sql(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", database=database
        )
        assert int(tables) > 3, name
    assert runs[1].stdout.count("is current") == 3


def test_migrate_tries_an_unreachable_database_again_then_names_the_step(tmp_path: Path) -> None:
    dead = f"postgresql://nobody:pw@127.0.0.1:{free_port()}/none"
    done = subprocess.run(
        [sys.executable, "docker/migrate.py", "prefect"],
        cwd=REPO,
        env={
            **os.environ,
            "PREFECT_API_DATABASE_CONNECTION_URL": dead.replace("postgresql", "postgresql+asyncpg"),
            "PREFECT_HOME": str(tmp_path),
            "CIFAR_MIGRATE_PATIENCE_S": "10",  # tried again 5 s later, then given up
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "migrate: Prefect's database: database not reachable yet (" in done.stdout
    assert "trying again in 5 s" in done.stdout
    assert "migrate: Prefect's database could not be migrated" in done.stderr


def test_wait_for_postgres_means_accepting_queries(postgres: Postgres) -> None:
    assert wait_for.problem(f"postgres://127.0.0.1:{postgres.port}") is None
    closed = wait_for.problem(f"postgres://127.0.0.1:{free_port()}")
    assert closed is not None and "Connection refused" in closed
