"""The compose stack under test: podman-compose with docker/compose.test.yml, its credentials,
and the host's clients of it (Prefect, MLflow and S3 each with its own credentials)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILES = (
    *("-f", "docker/docker-compose.yml", "-f", "docker/compose.test.yml"),
    *("-f", "tests/containers/compose.alerts.yml"),  # the alert webhook the tests read
)
# One project per checkout: a stack left by a killed run here is removed by the next run here,
# and another checkout's stack on this machine is never touched.
PROJECT = f"cifar-stack-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"
SERVICES = (
    "postgres",
    "s3",
    "mlflow",
    "prefect-server",
    "dask-scheduler",
    "dask-worker-1",
    "dask-worker-2",
    "prefect-worker",
)
IMAGES = (
    "localhost/debian-py:bookworm",
    "localhost/dask-train-cifar:latest",
    "localhost/dask-train-cifar-services:latest",
    "localhost/dask-train-cifar-s3:latest",
    "localhost/dask-train-cifar-postgres:latest",
)
# runc and cgroupfs: what this kind of machine needs (docker/podman-containers.conf)
ENGINE_ENV = {
    "CONTAINERS_CONF": os.environ.get(
        "CONTAINERS_CONF", str(REPO / "docker" / "podman-containers.conf")
    )
}
HEALTH_TIMEOUT_S = 300
RUN_TIMEOUT_S = 900
MODEL = "stack-classifier"
ALERTS_HOST = "alerts-listener:8080"  # tests/containers/compose.alerts.yml
DATABASES = ("prefect", "mlflow", "mlflow_auth", "optuna")


def skip_reason() -> str | None:
    """Why the stack cannot run here, or None."""
    missing = [
        tool for tool in ("podman", "podman-compose", "debootstrap") if not shutil.which(tool)
    ]
    if missing:
        return (
            f"no container engine here ({', '.join(missing)} not installed); as root on Debian, "
            "`make test-containers` installs podman, podman-compose, runc and debootstrap"
        )
    if os.environ.get("CIFAR_CONTAINER_TESTS") == "build":  # make test-containers
        return None
    env = {**os.environ, **ENGINE_ENV}
    absent = [
        image
        for image in IMAGES
        if subprocess.run(["podman", "image", "exists", image], env=env).returncode != 0
    ]
    if absent:
        return (
            f"the stack's images were never built on this machine ({', '.join(absent)} absent): "
            "a first build takes about 15 min and downloads about 3 GB, so `make test` leaves it "
            "out; run `make test-containers` once, then `make test` runs these tests too"
        )
    return None


def credentials() -> dict[str, str]:
    """Fresh random values for every variable of docker/.env.example (user names too)."""
    names = [
        line.split("=", 1)[0]
        for line in (REPO / "docker" / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    values = {name: secrets.token_hex(16) for name in names}
    values["CIFAR_ALERTS_URL"] = f"http://{ALERTS_HOST}/{secrets.token_hex(8)}"
    return values


@dataclass
class Stack:
    """A stack's environment: its credentials, host ports, secrets folder and commit."""

    env: dict[str, str]

    def compose(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            ["podman-compose", "-p", PROJECT, *COMPOSE_FILES, *args],
            cwd=REPO,
            env={**os.environ, **ENGINE_ENV, **self.env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman-compose {' '.join(args)}: {done.stdout}\n{done.stderr}")
        return done.stdout

    def one_shot(self, service: str) -> str:
        """Run a one-shot service (``deploy``) as ``make stack-up-local`` does; fail with its
        last lines when it fails (podman-compose's own exit status says nothing)."""
        done = subprocess.run(
            [
                *(sys.executable, "docker/one_shot.py", "podman-compose", "-p", PROJECT),
                *COMPOSE_FILES,
                *("--", service),
            ],
            cwd=REPO,
            env={**os.environ, **ENGINE_ENV, **self.env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise AssertionError(f"{service} failed: {done.stderr[-3000:]}")
        return done.stdout

    @property
    def prefect_env(self) -> dict[str, str]:
        """What a Prefect client on the host needs."""
        auth = f"{self.env['PREFECT_ADMIN_USER']}:{self.env['PREFECT_ADMIN_PASSWORD']}"
        return {
            "PREFECT_API_URL": f"http://127.0.0.1:{self.env['PREFECT_PORT']}/api",
            "PREFECT_API_AUTH_STRING": auth,
        }

    def mlflow(self, who: str = "TRAINER") -> Any:
        """An MLflow client of the stack, as ``who`` (TRAINER or ADMIN): it sets this process's
        MLFLOW_TRACKING_USERNAME and _PASSWORD (the tests put them back)."""
        from mlflow.tracking import MlflowClient

        os.environ["MLFLOW_TRACKING_USERNAME"] = self.env[f"MLFLOW_{who}_USER"]
        os.environ["MLFLOW_TRACKING_PASSWORD"] = self.env[f"MLFLOW_{who}_PASSWORD"]
        return MlflowClient(self.mlflow_url)

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.env['MLFLOW_PORT']}"

    def s3(self, who: str = "DATA") -> Any:
        """An S3 client with one identity's key: the data bucket's (the key the Prefect worker
        and Dask workers hold), or ``PREFECT`` (the Prefect worker's cache records)."""
        import s3fs

        return s3fs.S3FileSystem(
            endpoint_url=f"http://127.0.0.1:{self.env['S3_PORT']}",
            key=self.env[f"S3_{who}_ACCESS_KEY"],
            secret=self.env[f"S3_{who}_SECRET_KEY"],
            skip_instance_cache=True,
        )


def new_stack(secrets_dir: Path) -> Stack:
    """Credentials written as the stack's secrets (docker/write_secrets.py) into
    ``secrets_dir``, free host ports, and the commit the images are built from."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    # The shipped policy, with the tests' models in place of the pipeline's (as an operator
    # widens it: a file of their own)
    policy = secrets_dir.parent / "run-policy.toml"
    shipped = (REPO / "docker" / "run-policy.toml").read_text()
    models = f'registered_models = ["{MODEL}", "{MODEL}-tuned"]'
    policy.write_text(re.sub(r"(?m)^registered_models = .*$", models, shipped))
    env = {
        **credentials(),
        **{name: str(free_port()) for name in ("S3_PORT", "MLFLOW_PORT", "PREFECT_PORT")},
        "CIFAR_SECRETS_DIR": str(secrets_dir),
        "CIFAR_REGISTERED_MODELS": f"{MODEL},{MODEL}-tuned",
        "CIFAR_RUN_POLICY_FILE": str(policy),
        "GIT_SHA": commit,
    }
    subprocess.run(
        [sys.executable, "docker/write_secrets.py"],
        cwd=REPO,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
    )
    return Stack(env)


def podman(
    *args: str, check: bool = True, stdin: Any = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        env={**os.environ, **ENGINE_ENV},
        input=input,
        capture_output=True,
        text=True,
        check=check,
        stdin=stdin,
    )


def container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def alerts_received() -> list[dict[str, Any]]:
    """Every alert the stack's webhook received so far, in order (its log, one JSON line each)."""
    logs = podman("logs", container("alerts-listener")).stdout
    return [json.loads(line) for line in logs.splitlines() if line.startswith("{")]


def first_alert(matches: Callable[[dict[str, Any]], bool], within_s: float) -> dict[str, Any]:
    """The first alert the webhook received (or receives within ``within_s``) that ``matches``:
    its log followed as it is written (``podman logs --follow``), no polling."""
    follow = subprocess.Popen(
        ["podman", "logs", "--follow", container("alerts-listener")],
        env={**os.environ, **ENGINE_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + within_s
    try:
        assert follow.stdout is not None
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([follow.stdout], [], [], left)
            if not ready:
                break
            line = follow.stdout.readline()
            if not line:
                break
            if line.startswith("{") and matches(alert := json.loads(line)):
                return alert
    finally:
        follow.kill()
        follow.wait()
    raise AssertionError(f"no matching alert within {within_s} s; received: {alerts_received()}")


def wait_healthy(services: tuple[str, ...]) -> None:
    """podman runs no healthchecks by itself here (no systemd): run each until it passes."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    for service in services:
        while True:
            check = podman("healthcheck", "run", container(service), check=False)
            if check.returncode == 0:
                break
            if time.monotonic() > deadline:
                logs = podman("logs", "--tail", "40", container(service), check=False)
                raise AssertionError(
                    f"{service} not healthy after {HEALTH_TIMEOUT_S} s: {check.stdout}"
                    f"{check.stderr}\n{logs.stdout}{logs.stderr}"
                )
            time.sleep(2)


def up(stack: Stack) -> None:
    """Every service up and healthy, then the one-shot deploy."""
    stack.compose("up", "-d")
    wait_healthy(SERVICES)
    stack.one_shot("deploy")


def remove_networks() -> None:
    """The project's networks (podman-compose 1.0 leaves them behind on ``down``)."""
    names = podman(
        "network", "ls", "--filter", f"label=io.podman.compose.project={PROJECT}",
        "--format", "{{.Name}}",
    ).stdout.split()  # fmt: skip
    if names:
        podman("network", "rm", *names, check=False)


def leftovers() -> list[str]:
    found = []
    for kind, field in (
        ("ps -a", "{{.Names}}"),
        ("network ls", "{{.Name}}"),
        ("volume ls", "{{.Name}}"),
    ):
        out = podman(*kind.split(), "--format", field).stdout
        found += [f"{kind}: {name}" for name in out.split() if name.startswith(PROJECT)]
    return found


def start_run(
    stack: Stack, deployment: str, parameters: dict[str, Any], job_variables: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """``prefect deployment run`` through the stack's API, from the host, waiting for the run to
    end: its last stdout line is the final flow run's id, state and message (JSON)."""
    code = (
        "import json, sys\n"
        "from prefect.deployments import run_deployment\n"
        f"run = run_deployment({deployment!r}, parameters=json.loads(sys.argv[1]), "
        f"job_variables=json.loads(sys.argv[2]), timeout={RUN_TIMEOUT_S}, poll_interval=2)\n"
        "print(json.dumps({'id': str(run.id), 'state': run.state.type.value, "
        "'message': run.state.message}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(parameters), json.dumps(job_variables)],
        env={**os.environ, **stack.prefect_env},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
    )


def run_deployment(stack: Stack, deployment: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A run of ``deployment`` to its end: the final flow run's id, state and message."""
    done = start_run(stack, deployment, parameters, {})
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def psql(database: str, query: str) -> str:
    """A query as the superuser inside the postgres container (its socket)."""
    done = podman(
        "exec", container("postgres"), "psql", "-U", "postgres", "-d", database, "-At", "-c", query
    )
    return done.stdout.strip()


def pg_dump(database: str, path: Path) -> None:
    """``pg_dump -Fc`` of ``database`` into ``path`` on the host, as docs/containers.md says."""
    with open(path, "wb") as dump:
        subprocess.run(
            ["podman", "exec", container("postgres"), "pg_dump", "-U", "postgres", "-Fc", database],
            env={**os.environ, **ENGINE_ENV},
            stdout=dump,
            check=True,
        )


def pg_restore(database: str, path: Path) -> None:
    """``pg_restore --clean`` of the dump at ``path`` into ``database`` (as docs/containers.md
    says: into the empty databases of a fresh postgres, before the services start)."""
    with open(path, "rb") as dump:
        subprocess.run(
            [
                *("podman", "exec", "-i", container("postgres")),
                *("pg_restore", "-U", "postgres", "--clean", "--if-exists", "-d", database),
            ],
            env={**os.environ, **ENGINE_ENV},
            stdin=dump,
            check=True,
        )


def deployment_version(stack: Stack, name: str) -> str:
    """The version of deployment ``name`` on the stack's Prefect server, read from the host."""
    code = (
        "import asyncio, sys\n"
        "from prefect.client.orchestration import get_client\n"
        "async def main():\n"
        "    async with get_client() as client:\n"
        "        print((await client.read_deployment_by_name(sys.argv[1])).version)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, name],
        env={**os.environ, **stack.prefect_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]
