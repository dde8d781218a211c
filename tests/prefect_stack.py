"""A real Prefect server and process worker on free ports (for tests and benchmarks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[1]
POOL = "cifar"
POOL_TEMPLATE = REPO / "deployments" / "work-pool.json"  # production's: env, command fixed
WORKER_PID = "CIFAR_TESTS_PREFECT_WORKER_PID"  # in the environment prefect_stack yields
STARTUP_S = 120.0


def _prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def _wait_until(ready: object, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + STARTUP_S
    while not ready():  # type: ignore[operator]
        if process.poll() is not None:
            raise RuntimeError(
                f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {STARTUP_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _pool_ready(api_url: str, pool: str = POOL) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/work_pools/{pool}", timeout=2) as response:
            return b'"status":"READY"' in response.read().replace(b" ", b"")
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class PrefectServer:
    """``prefect server start`` on ``env``'s port and database; it can be stopped and started
    again there (an outage)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.api_url = env["PREFECT_API_URL"]
        self.port = self.api_url.rsplit(":", 1)[1].split("/", 1)[0]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self._process = subprocess.Popen(
                _prefect(
                    *("server", "start", "--host", "127.0.0.1", "--port", self.port),
                    *("--no-ui", "--analytics-off"),
                ),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        _wait_until(
            lambda: _healthy(f"{self.api_url}/health"), self._process, self.log, "Prefect server"
        )

    def stop(self) -> None:
        if self._process is not None:
            _stop(self._process, signal.SIGTERM)
        self._process = None


# Concurrency slots' leases on disk (in PREFECT_HOME), not in the server's memory: a server
# restarted while a run held a slot then expires the lease and frees the slot; in memory, the
# lease was lost and the slot stayed taken for good (seen in the soak: the next training waited
# forever for the `dask-training` tag's only slot, a tag limit the trainings no longer take;
# deployments' concurrency limits hold their slots by lease the same way)
LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"
# Automations see the events that follow a state change from before a restart at once
EVENT_ORDERING = "deployments.event_ordering"


def prefect_environment(home: Path, database_url: str) -> dict[str, str]:
    """The environment of a Prefect server on a free port with its database (PostgreSQL:
    ``postgresql://user:password@host/db``), its workers and clients."""
    port = free_port()
    return {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url.replace(
            "postgresql://", "postgresql+asyncpg://", 1
        ),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_HEARTBEAT_SECONDS": "5",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",  # as the stack's worker sets it
        # A run held back by a deployment's concurrency limit is retried after this (default 30)
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
        "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": LEASE_STORAGE,  # as the stack's server
        "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": EVENT_ORDERING,  # as the stack's server
        "PWD": str(REPO),
    }


@contextmanager
def prefect_stack(home: Path, database_url: str) -> Iterator[dict[str, str]]:
    """Environment of a running Prefect server with a process work pool and worker (its pid
    under ``WORKER_PID``).

    ``database_url``: the server's PostgreSQL database (``postgresql://user:password@host/db``).
    Not SQLite: there, Prefect's services lose writes under concurrent load ("database is
    locked"; the automations' trigger service then dead-letters an event and an alert is lost).
    """
    env = prefect_environment(home, database_url)
    server = PrefectServer(env, home / "server.log")
    worker = None
    try:
        server.start()
        create_pool(env)
        worker = start_worker(env, "w1", home / "worker.log")
        env[WORKER_PID] = str(worker.pid)
        yield env
    finally:
        if worker is not None:
            _stop(worker, signal.SIGINT)  # the worker ignores SIGTERM
        server.stop()


def create_pool(env: dict[str, str], name: str = POOL, injectable: bool = True) -> None:
    """The process work pool the deployments name, from deployments/work-pool.json.

    ``injectable``: a run may also set the job variables ``env`` and ``command`` (default: the
    template's), as tests do to inject faults; production's template forbids both.
    """
    template = json.loads(POOL_TEMPLATE.read_text())
    if injectable:
        config, variables = template["job_configuration"], template["variables"]["properties"]
        variables["env"] = {"type": "object", "default": config["env"]}
        variables["command"] = {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
        config["env"], config["command"] = "{{ env }}", "{{ command }}"
    file = Path(env["PREFECT_HOME"]) / f"pool-{name}.json"
    file.write_text(json.dumps(template))
    subprocess.run(
        _prefect(
            "work-pool",
            "create",
            name,
            "--type",
            "process",
            "--overwrite",
            "--base-job-template",
            str(file),
        ),
        env=env,
        check=True,
        capture_output=True,
    )


def start_worker(
    env: dict[str, str], name: str, log: Path, pool: str = POOL
) -> subprocess.Popen[bytes]:
    """A process worker of ``pool``, polling every second, ready when it returns; in a session
    of its own (a test may kill it with everything it started, as a host dies)."""
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            _prefect("worker", "start", "--pool", pool, "--type", "process", "--name", name),
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _wait_until(lambda: _pool_ready(env["PREFECT_API_URL"], pool), worker, log, "Prefect worker")
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """A worker of ``start_worker`` stopped as Ctrl-C stops it (it ignores SIGTERM)."""
    _stop(worker, signal.SIGINT)


def deploy_all(env: dict[str, str]) -> None:
    """Register every deployment of deployments/prefect.yaml, as the README says."""
    subprocess.run(
        _prefect("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"),
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
