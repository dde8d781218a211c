"""A real Prefect server and process worker on free ports (for tests and benchmarks)."""

from __future__ import annotations

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


def _pool_ready(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/work_pools/{POOL}", timeout=2) as response:
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


@contextmanager
def prefect_stack(home: Path, database_url: str) -> Iterator[dict[str, str]]:
    """Environment of a running Prefect server with a process work pool and worker (its pid
    under ``WORKER_PID``).

    ``database_url``: the server's PostgreSQL database (``postgresql://user:password@host/db``).
    Not SQLite: there, Prefect's services lose writes under concurrent load ("database is
    locked"; the automations' trigger service then dead-letters an event and an alert is lost).
    """
    port = free_port()
    env = {
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
        # A run held back by a deployment's concurrency limit is retried after this (default 30)
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
        "PWD": str(REPO),
    }
    server_log, worker_log = home / "server.log", home / "worker.log"
    with open(server_log, "wb") as out:
        server = subprocess.Popen(
            _prefect(
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-ui",
                "--analytics-off",
            ),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    worker = None
    try:
        _wait_until(
            lambda: _healthy(f"{env['PREFECT_API_URL']}/health"),
            server,
            server_log,
            "Prefect server",
        )
        subprocess.run(
            _prefect("work-pool", "create", POOL, "--type", "process", "--overwrite"),
            env=env,
            check=True,
            capture_output=True,
        )
        worker = start_worker(env, "w1", worker_log)
        env[WORKER_PID] = str(worker.pid)
        yield env
    finally:
        if worker is not None:
            _stop(worker, signal.SIGINT)  # the worker ignores SIGTERM
        _stop(server, signal.SIGTERM)


def start_worker(env: dict[str, str], name: str, log: Path) -> subprocess.Popen[bytes]:
    """A process worker of the pool, polling every second, ready when it returns; in a session
    of its own (a test may kill it with everything it started, as a host dies)."""
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            _prefect("worker", "start", "--pool", POOL, "--type", "process", "--name", name),
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _wait_until(lambda: _pool_ready(env["PREFECT_API_URL"]), worker, log, "Prefect worker")
    return worker


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
