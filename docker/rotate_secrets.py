#!/usr/bin/env python3
"""Rotate the stack's credentials: give the new values in docker/.env (or the environment), then

    make stack-rotate     # python3 docker/rotate_secrets.py COMPOSE...  (the compose command)

Every credential whose value differs from the secret the stack runs on (docker/secrets/) is
changed where it lives, then its secret file rewritten and each service that reads it
restarted, in the compose file's order (servers before their clients):

- a PostgreSQL role's password (``POSTGRES_``, ``PREFECT_DB_``, ``MLFLOW_DB_``,
  ``OPTUNA_DB_PASSWORD``): ``ALTER ROLE`` in the running postgres, as its superuser over the
  container's own socket, the password on psql's input (never a command line);
- MLflow's admin password: changed through MLflow's API inside its container, as the admin;
  the publisher's and the users' accounts' (``MLFLOW_TRAINER_PASSWORD``,
  ``MLFLOW_USER_PASSWORD``) are set by the deploy one-shot, run again;
- S3's identities, Prefect's auth string, MLflow's Flask key: read by their services at start;
- the alert webhook: the sentinel restarted, and the deploy one-shot rewrites Prefect's block.

postgres itself is not restarted (it reads its secrets on first start only). A restart ends
the flow runs in flight on a restarted Prefect worker (Crashed, and alerted): rotate between
runs. User names are not renamed this way (refused, naming them). Run again after a failure:
each change is made again or found made. The Dask and SeaweedFS certificates are renewed by
deleting them from docker/secrets/ and running ``make stack-up`` (docs/containers.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # write_secrets.py, beside this one
import write_secrets
from one_shot import status

# Who reads each secret file (docker-compose.yml's ``secrets:``; tests/docker keep them in
# step), long-running services in the compose file's order. postgres, which reads its own only
# on first start, and the one-shots are left out: the deploy one-shot is run again instead.
READ_BY: dict[str, tuple[str, ...]] = {
    "postgres_password": (),
    "prefect_db_password": ("prefect-server",),
    "mlflow_db_password": ("mlflow", "mlflow-maintenance"),
    "optuna_db_password": ("prefect-worker",),
    "mlflow_auth_ini": ("mlflow",),
    "mlflow_flask_secret_key": ("mlflow",),
    "mlflow_admin_password": ("mlflow-maintenance",),
    "mlflow_trainer_password": ("prefect-worker",),
    "mlflow_user_password": (),  # the deploy one-shot's only
    "prefect_auth_string": ("prefect-server", "prefect-worker", "sentinel"),
    "alerts_url": ("sentinel",),
    "sentinel_heartbeat_url": ("sentinel",),
    "s3_admin_access_key": ("s3",),
    "s3_admin_secret_key": ("s3",),
    "s3_data_access_key": ("s3", "dask-worker-1", "dask-worker-2", "prefect-worker"),
    "s3_data_secret_key": ("s3", "dask-worker-1", "dask-worker-2", "prefect-worker"),
    "s3_mlflow_access_key": ("s3", "mlflow"),
    "s3_mlflow_secret_key": ("s3", "mlflow"),
    "s3_prefect_access_key": ("s3",),
    "s3_prefect_secret_key": ("s3",),
    "s3_prefect_credentials": ("prefect-worker",),
}
ORDER = (
    "s3", "mlflow", "mlflow-maintenance", "prefect-server", "dask-worker-1", "dask-worker-2",
    "prefect-worker", "sentinel",
)  # fmt: skip
# The secrets the deploy one-shot reads, and so runs again for
DEPLOY_READS = frozenset(
    {
        "prefect_auth_string",
        "mlflow_admin_password",
        "mlflow_trainer_password",
        "mlflow_user_password",
        "alerts_url",
    }
)
ROLES = {  # secret file -> PostgreSQL role
    "postgres_password": "postgres",
    "prefect_db_password": "prefect",
    "mlflow_db_password": "mlflow",
    "optuna_db_password": "optuna",
}

# Run inside the mlflow container: its admin's password changed by the admin, the new one on
# stdin. A run stopped half-way left the new password in place: then the new one logs in.
MLFLOW_ADMIN = """
import base64, configparser, json, sys, urllib.error, urllib.request
ini = configparser.ConfigParser()
ini.read("/run/secrets/mlflow_auth_ini")
user, old = ini["mlflow"]["admin_username"], ini["mlflow"]["admin_password"]
new = sys.stdin.read().strip()
def change(current):
    body = {"username": user, "password": new, "current_password": current}
    request = urllib.request.Request(
        "http://localhost:5000/api/2.0/mlflow/users/update-password", method="PATCH",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json",
        "Host": "mlflow:5000",
        "Authorization": "Basic " + base64.b64encode(f"{user}:{current}".encode()).decode()})
    urllib.request.urlopen(request, timeout=60)
try:
    change(old)
except urllib.error.HTTPError as error:
    if error.code != 401:
        sys.exit(f"MLflow refused the admin's new password: HTTP {error.code}")
    change(new)
"""


def current_files() -> dict[str, str]:
    """The secret files the stack runs on."""
    if not write_secrets.SECRETS.is_dir():
        sys.exit(
            f"rotate: no secrets in {write_secrets.SECRETS}: set the stack up first (make stack-up)"
        )
    return {
        path.name: path.read_text() for path in write_secrets.SECRETS.iterdir() if path.is_file()
    }


def admin_renamed(values: dict[str, str], files: dict[str, str]) -> bool:
    """Whether MLflow's admin was given another name (MLflow makes its admin on first start
    only: a new name would be an account nobody created). A new training account's name is
    made by the deploy one-shot, as on first start."""
    ini = files.get("mlflow_auth_ini", "")
    return f"admin_username = {values['MLFLOW_ADMIN_USER']}\n" not in ini


def changed_files(values: dict[str, str], files: dict[str, str]) -> list[str]:
    """The secret files whose contents ``values`` change."""
    wanted = write_secrets.secret_files(values)
    return [
        name for name, text in wanted.items() if files.get(name) != write_secrets.contents(text)
    ]


def compose(command: list[str], *args: str, stdin: str | None = None) -> None:
    """``COMPOSE ARGS...``; exits with its last lines when it fails (podman-compose's own
    status says nothing: one_shot.status reads its ``exit code`` line)."""
    done = subprocess.run([*command, *args], input=stdin, text=True, capture_output=True)
    output = done.stdout + done.stderr
    if status(done.returncode, output) != 0:
        tail = " | ".join(output.strip().splitlines()[-5:])
        sys.exit(f"rotate: {' '.join(args[:3])} failed: {tail}")


def restarts(changed: list[str]) -> list[str]:
    """The services to restart, in order."""
    wanted = {service for name in changed for service in READ_BY.get(name, ())}
    return [service for service in ORDER if service in wanted]


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(
            "usage: rotate_secrets.py COMPOSE...  (docker compose -f docker/docker-compose.yml)"
        )
    values = write_secrets.wanted_values()
    files = current_files()
    if admin_renamed(values, files):
        sys.exit(
            "rotate: MLFLOW_ADMIN_USER changed: a rotation changes passwords and keys, not "
            "MLflow's admin (make the new admin in MLflow first, then give its name here)"
        )
    changed = changed_files(values, files)
    if not changed:
        print("rotate: every credential is already the one the stack runs on")
        return
    wanted = write_secrets.secret_files(values)
    for name in changed:
        if name in ROLES:  # values are letters, digits, '-', '_', '.': nothing to quote
            sql = f"ALTER ROLE \"{ROLES[name]}\" PASSWORD '{wanted[name]}';\n"
            compose(argv, "exec", "-T", "postgres", "psql", "-U", "postgres", "-d", "postgres",
                    "-v", "ON_ERROR_STOP=1", "-q", stdin=sql)  # fmt: skip
            print(f"rotate: PostgreSQL role {ROLES[name]!r} has its new password")
    if "mlflow_admin_password" in changed:
        compose(argv, "exec", "-T", "mlflow", "python", "-c", MLFLOW_ADMIN,
                stdin=values["MLFLOW_ADMIN_PASSWORD"])  # fmt: skip
        print("rotate: MLflow's admin has its new password")
    write_secrets.write(values)
    print(f"rotate: rewrote {', '.join(changed)}")
    for service in restarts(changed):
        compose(argv, "restart", service)
        print(f"rotate: restarted {service}")
    if DEPLOY_READS & set(changed):
        done = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("one_shot.py")), *argv, "--", "deploy"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(f"rotate: the deploy one-shot failed: {done.stderr.strip()[-2000:]}")
        print("rotate: the deploy one-shot ran again (MLflow's training account, the alert block)")


if __name__ == "__main__":
    main(sys.argv[1:])
