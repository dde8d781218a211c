"""The stack's secrets: written from the environment (docker/write_secrets.py), refused by name
when one is missing or unusable, and given to a command from files (docker/with_secrets.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCKER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _values() -> dict[str, str]:
    names = _module("write_secrets").variables()
    return {
        name: f"https://hooks.example/{index:02d}"
        if name.endswith("_URL")
        else f"value{index:02d}of{name.lower()}"
        for index, name in enumerate(names)
    }


def _write(tmp_path: Path, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in values}
    return subprocess.run(
        [sys.executable, str(DOCKER / "write_secrets.py")],
        env={**env, **values, "CIFAR_SECRETS_DIR": str(tmp_path / "secrets")},
        capture_output=True,
        text=True,
        check=False,
    )


def test_secrets_the_example_lists_every_credential_and_each_is_used() -> None:
    names = _module("write_secrets").variables()
    assert len(names) == len(set(names)) == 23
    assert all(n.endswith(("_USER", "_PASSWORD", "_KEY", "_URL")) for n in names), names
    values = _values()
    files = "".join(_module("write_secrets").secret_files(values).values())
    compose = (DOCKER / "docker-compose.yml").read_text()
    unused = [n for n in names if values[n] not in files and f"${{{n}:?" not in compose]
    assert unused == []


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_secrets_are_written_as_files_only_their_folder_owner_reaches(tmp_path: Path) -> None:
    values = _values()
    done = _write(tmp_path, values)
    assert done.returncode == 0, done.stderr
    assert not [v for v in values.values() if v in done.stdout + done.stderr]
    folder = tmp_path / "secrets"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    declared = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())["secrets"]
    files = sorted(p.name for p in folder.iterdir())
    authorities = ["dask_ca_key", "s3_grpc_ca_key"]  # the setup's alone: mounted nowhere
    assert files == sorted([*declared, *authorities])  # every secret compose mounts, no other
    assert all(stat.S_IMODE((folder / k).stat().st_mode) == 0o600 for k in authorities)
    files = sorted(declared)
    read = {name: (folder / name).read_text() for name in files}
    assert read["postgres_password"] == values["POSTGRES_PASSWORD"] + "\n"
    assert read["prefect_auth_string"] == (
        f"{values['PREFECT_ADMIN_USER']}:{values['PREFECT_ADMIN_PASSWORD']}\n"
    )
    database_passwords = [values[f"{who}_DB_PASSWORD"] for who in ("PREFECT", "MLFLOW", "OPTUNA")]
    in_urls = [u for text in read.values() for u in re.findall(r"\w+://\S+", text)]
    assert [u for u in in_urls if any(p in u for p in database_passwords)] == []
    assert f"admin_password = {values['MLFLOW_ADMIN_PASSWORD']}\n" in read["mlflow_auth_ini"]
    assert read["s3_data_secret_key"] == values["S3_DATA_SECRET_KEY"] + "\n"


def test_secrets_an_env_file_open_to_others_is_made_owner_only_saying_so(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("POSTGRES_PASSWORD=x\n")
    env_file.chmod(0o644)  # as `cp docker/.env.example docker/.env` leaves it
    said = _module("write_secrets").owner_only(env_file)
    assert said == f"{env_file} was open to other users (mode 644): made 600"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert _module("write_secrets").owner_only(env_file) is None  # nothing more to do


@pytest.mark.integration  # starts a process (tests/process_guard.py)
@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("MLFLOW_TRAINER_PASSWORD", "", "MLFLOW_TRAINER_PASSWORD is not set"),
        ("S3_DATA_SECRET_KEY", "has space", "S3_DATA_SECRET_KEY may hold only letters"),
        ("MLFLOW_ADMIN_PASSWORD", "short1", "MLFLOW_ADMIN_PASSWORD is shorter than 12"),
        ("CIFAR_ALERTS_URL", "hooks.example", "CIFAR_ALERTS_URL must be an http:// or https://"),
    ],
)
def test_secrets_refuse_a_missing_or_unusable_value_naming_it(
    tmp_path: Path, name: str, value: str, why: str
) -> None:
    done = _write(tmp_path, {**_values(), name: value})
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].strip().startswith(why)
    assert not (tmp_path / "secrets").exists()


def test_with_secrets_sets_each_variable_from_its_secret_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_secrets = _module("with_secrets")
    monkeypatch.setattr(with_secrets, "SECRETS", f"{tmp_path}/")
    (tmp_path / "db_url").write_text("postgresql://u:p@h/d\n")
    loaded = with_secrets.load(
        {
            "DATABASE_URL_FILE": f"{tmp_path}/db_url",
            "CIFAR_LOG_FILE": "/var/log/train.log",  # not a secret: left as it is
            # a secret file its program reads itself (botocore): the path stays, not the keys
            "AWS_SHARED_CREDENTIALS_FILE": f"{tmp_path}/db_url",
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": f"{tmp_path}/db_url",
            "PATH": "/bin",
        }
    )
    assert loaded == {
        "DATABASE_URL": "postgresql://u:p@h/d",
        "CIFAR_LOG_FILE": "/var/log/train.log",
        "AWS_SHARED_CREDENTIALS_FILE": f"{tmp_path}/db_url",
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": f"{tmp_path}/db_url",
        "PATH": "/bin",
    }
    with pytest.raises(SystemExit, match="cannot read MISSING_FILE"):
        with_secrets.load({"MISSING_FILE": f"{tmp_path}/absent"})


@pytest.mark.parametrize(
    "value",
    ["${CIFAR_ALERTS_DEPLOYMENTS:-}", "${A}", "${A-}", "${A:?set A}", "x,${A:-b}", "${a_1:-}"],
)
def test_with_secrets_refuses_a_value_the_compose_engine_left_unexpanded(value: str) -> None:
    with_secrets = _module("with_secrets")
    with pytest.raises(SystemExit, match=r"^with-secrets: SOME_SETTING is .*did not expand"):
        with_secrets.load({"PATH": "/bin", "SOME_SETTING": value})
    assert with_secrets.load({"PRICE": "$5", "TEMPLATE": "{{ x }}", "ALONE": "${"})["PRICE"] == "$5"


def _verifies(folder: Path, authority: str, certificate: str) -> bool:
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", folder / authority, folder / certificate],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_secrets_make_each_system_its_own_certificates_once(tmp_path: Path) -> None:
    assert _write(tmp_path, _values()).returncode == 0
    folder = tmp_path / "secrets"
    assert _verifies(folder, "dask_ca", "dask_cert")
    assert _verifies(folder, "s3_grpc_ca", "s3_grpc_cert")
    # a member of one system is no member of the other
    assert not _verifies(folder, "s3_grpc_ca", "dask_cert")
    assert not _verifies(folder, "dask_ca", "s3_grpc_cert")
    before = (folder / "dask_cert").read_bytes()
    again = _write(tmp_path, _values())
    assert again.returncode == 0 and "certificates" not in again.stdout  # kept, not remade
    assert (folder / "dask_cert").read_bytes() == before
