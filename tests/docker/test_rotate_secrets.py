"""docker/rotate_secrets.py without a stack: what it changes and restarts for each credential,
kept in step with the compose file (the rotations themselves: tests/containers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker.test_secrets import DOCKER, _module, _values, _write


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def _long_running(service: dict[str, Any]) -> bool:
    return service.get("restart") != "no" and "profiles" not in service


def test_rotate_restarts_every_long_running_reader_of_a_secret_in_compose_order() -> None:
    rotate = _module("rotate_secrets")
    services = _compose()["services"]
    files = _module("write_secrets").secret_files(_values())
    read_by = {
        name: {
            s
            for s, service in services.items()
            if name in service.get("secrets", []) and _long_running(service) and s != "postgres"
        }
        for name in files
    }
    assert {name: set(who) for name, who in rotate.READ_BY.items()} == read_by
    in_order = [s for s in services if any(s in who for who in read_by.values())]
    assert list(rotate.ORDER) == in_order
    assert set(services["deploy"]["secrets"]) & set(files) == rotate.DEPLOY_READS
    assert set(rotate.ROLES) == {n for n in files if n.endswith("_password") and "db" in n} | {
        "postgres_password"
    }


@pytest.mark.parametrize(
    ("variable", "files", "restarted"),
    [
        ("PREFECT_DB_PASSWORD", ["prefect_db_password"], ["prefect-server"]),
        ("MLFLOW_ADMIN_PASSWORD", ["mlflow_admin_password", "mlflow_auth_ini"],
         ["mlflow", "mlflow-maintenance"]),
        ("PREFECT_ADMIN_PASSWORD", ["prefect_auth_string"],
         ["prefect-server", "prefect-worker", "sentinel"]),
        ("S3_DATA_SECRET_KEY", ["s3_data_secret_key"],
         ["s3", "dask-worker-1", "dask-worker-2", "prefect-worker"]),
    ],
)  # fmt: skip
def test_rotate_changes_only_what_a_new_value_touches(
    variable: str, files: list[str], restarted: list[str]
) -> None:
    rotate = _module("rotate_secrets")
    before = _values()
    on_disk = {
        name: rotate.write_secrets.contents(text)
        for name, text in rotate.write_secrets.secret_files(before).items()
    }
    after = {**before, variable: before[variable] + "x"}
    changed = rotate.changed_files(after, on_disk)
    assert sorted(changed) == sorted(files)
    assert rotate.restarts(changed) == restarted


def _rotate(tmp_path: Path, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in values}
    return subprocess.run(
        [sys.executable, str(DOCKER / "rotate_secrets.py"), "false"],  # a compose that fails
        env={**env, **values, "CIFAR_SECRETS_DIR": str(tmp_path / "secrets")},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_rotate_with_nothing_changed_touches_nothing(tmp_path: Path) -> None:
    values = _values()
    assert _write(tmp_path, values).returncode == 0
    done = _rotate(tmp_path, values)
    assert done.returncode == 0, done.stderr
    assert "every credential is already the one the stack runs on" in done.stdout


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_rotate_refuses_to_rename_mlflow_admin_changing_nothing(tmp_path: Path) -> None:
    values = _values()
    assert _write(tmp_path, values).returncode == 0
    before = {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()}
    done = _rotate(tmp_path, {**values, "MLFLOW_ADMIN_USER": "someone-else"})
    assert done.returncode != 0
    assert "MLFLOW_ADMIN_USER changed" in done.stderr
    assert {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()} == before


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_rotate_that_cannot_reach_postgres_fails_naming_it_and_rewrites_nothing(
    tmp_path: Path,
) -> None:
    values = _values()
    assert _write(tmp_path, values).returncode == 0
    before = {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()}
    done = _rotate(tmp_path, {**values, "OPTUNA_DB_PASSWORD": "new-optuna-password"})
    assert done.returncode != 0
    assert done.stderr.startswith("rotate: exec -T postgres failed")
    assert "new-optuna-password" not in done.stdout + done.stderr
    assert {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()} == before
