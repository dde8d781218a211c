#!/usr/bin/env python3
"""Write the compose stack's secrets (docker/secrets/, one file each, in a folder only you may
enter) from the environment variables docker/.env.example lists, or docker/.env.

    python3 docker/write_secrets.py      # make stack-up runs it

Refuses, naming each, a variable that is missing, or whose value is not letters, digits, ``-``,
``_`` or ``.`` (values are written into URLs, JSON and an ini file), or a password MLflow would
refuse (shorter than 12). Files that the services need in another form (Prefect's database URL
auth string, MLflow's auth configuration) are made from them, and the inside certificates once
(docker/certificates.py); nothing is printed but the names of the files. No database password
goes into a URL (a URL lands in process listings and logs): the services give it to libpq and
Prefect on its own (``PGPASSWORD``, ``PREFECT_SERVER_DATABASE_PASSWORD``).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

DOCKER = Path(__file__).resolve().parent
EXAMPLE = DOCKER / ".env.example"
ENV_FILE = DOCKER / ".env"
SECRETS = Path(os.environ.get("CIFAR_SECRETS_DIR") or DOCKER / "secrets")  # as compose reads it
VALUE = re.compile(r"[A-Za-z0-9._-]+")
URL = re.compile(r"https?://[^\s\"'\\]+")  # the alert webhook (its token is a credential)
URLS = ("CIFAR_ALERTS_URL", "CIFAR_SENTINEL_HEARTBEAT_URL")
OPTIONAL = ("CIFAR_SENTINEL_HEARTBEAT_URL",)  # empty: none
MLFLOW_PASSWORDS = ("MLFLOW_ADMIN_PASSWORD", "MLFLOW_TRAINER_PASSWORD", "MLFLOW_USER_PASSWORD")
MLFLOW_MIN_LENGTH = 12

# NO_PERMISSIONS: an account sees only what deployments/mlflow_access.py granted it
AUTH_INI = """\
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = postgresql://mlflow@postgres:5432/mlflow_auth
admin_username = {MLFLOW_ADMIN_USER}
admin_password = {MLFLOW_ADMIN_PASSWORD}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


# The Prefect worker's second S3 key (its cache records' bucket), as a profile of its own: the
# data key stays in the environment, for everything else
PREFECT_CREDENTIALS = """\
[prefect-cache]
aws_access_key_id = {S3_PREFECT_ACCESS_KEY}
aws_secret_access_key = {S3_PREFECT_SECRET_KEY}
"""


def variables() -> list[str]:
    """The names docker/.env.example lists (``NAME=`` lines)."""
    names = []
    for line in EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            names.append(line.split("=", 1)[0].strip())
    return names


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines of a compose .env file (no quotes, no expansion)."""
    found = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                name, value = line.split("=", 1)
                found[name.strip()] = value.strip()
    return found


def owner_only(path: Path) -> str | None:
    """``path`` (docker/.env: every credential) made readable by its owner only; what was
    changed, if anything."""
    if not path.exists():
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o077:
        return None
    path.chmod(mode & 0o700)
    return f"{path} was open to other users (mode {mode:o}): made {mode & 0o700:o}"


def problems(values: dict[str, str], names: list[str]) -> list[str]:
    """Why the values cannot be used, one line per variable."""
    found = []
    for name in names:
        value = values.get(name, "")
        if not value and name in OPTIONAL:
            continue
        if not value:
            found.append(f"{name} is not set")
        elif name in URLS:
            if not URL.fullmatch(value):
                found.append(f"{name} must be an http:// or https:// URL")
        elif not VALUE.fullmatch(value):
            found.append(f"{name} may hold only letters, digits, '-', '_' and '.'")
        elif name in MLFLOW_PASSWORDS and len(value) < MLFLOW_MIN_LENGTH:
            found.append(f"{name} is shorter than {MLFLOW_MIN_LENGTH} (MLflow refuses it)")
    return found


def secret_files(v: dict[str, str]) -> dict[str, str]:
    """Every secret file of docker-compose.yml and its contents."""
    raw = {
        "postgres_password": v["POSTGRES_PASSWORD"],
        "prefect_db_password": v["PREFECT_DB_PASSWORD"],
        "mlflow_db_password": v["MLFLOW_DB_PASSWORD"],
        "optuna_db_password": v["OPTUNA_DB_PASSWORD"],
        "mlflow_admin_password": v["MLFLOW_ADMIN_PASSWORD"],
        "mlflow_trainer_password": v["MLFLOW_TRAINER_PASSWORD"],
        "mlflow_user_password": v["MLFLOW_USER_PASSWORD"],
        "mlflow_flask_secret_key": v["MLFLOW_FLASK_SECRET_KEY"],
        "alerts_url": v["CIFAR_ALERTS_URL"],
        "sentinel_heartbeat_url": v.get("CIFAR_SENTINEL_HEARTBEAT_URL", ""),
        **{
            f"s3_{who}_{part}_key": v[f"S3_{who.upper()}_{part.upper()}_KEY"]
            for who in ("admin", "data", "mlflow", "prefect")
            for part in ("access", "secret")
        },
    }
    return {
        **raw,
        "prefect_auth_string": f"{v['PREFECT_ADMIN_USER']}:{v['PREFECT_ADMIN_PASSWORD']}",
        "mlflow_auth_ini": AUTH_INI.format(**v),
        "s3_prefect_credentials": PREFECT_CREDENTIALS.format(**v),
    }


def wanted_values() -> dict[str, str]:
    """The credentials asked for (the environment over docker/.env); exits naming each one
    that cannot be used."""
    if changed := owner_only(ENV_FILE):
        print(changed)
    names = variables()
    values = {**read_env_file(ENV_FILE), **{n: os.environ[n] for n in names if n in os.environ}}
    if found := problems(values, names):
        sys.exit(
            "The stack's credentials are not ready (docker/.env.example lists them; set them "
            "in the environment or in docker/.env):\n  " + "\n  ".join(found)
        )
    return values


def contents(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def write(values: dict[str, str]) -> None:
    """Every secret file written from ``values``, in place (a running container's mount of a
    file sees the new contents once its service restarts)."""
    SECRETS.mkdir(mode=0o700, exist_ok=True)
    SECRETS.chmod(0o700)  # the host's other users; in a container, its user reads the file
    for name, content in secret_files(values).items():
        path = SECRETS / name
        path.write_text(contents(content))
        path.chmod(0o644)


def main() -> None:
    values = wanted_values()
    write(values)
    print(f"Wrote {len(secret_files(values))} secrets to {SECRETS}")
    sys.path.insert(0, str(DOCKER))  # docker/certificates.py, beside this script
    import certificates

    if made := certificates.ensure(SECRETS):
        print(f"Made the certificates {', '.join(made)} in {SECRETS}")


if __name__ == "__main__":
    main()
