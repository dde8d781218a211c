"""Prefect's server for a local run, started the moment the command starts.

With no PREFECT_API_URL, Prefect starts a temporary server at the first flow call: it first
imports the server in the calling process (about 5 s here), then starts it in a subprocess and
blocks until it answers. This module starts a server the moment the command starts, with
Prefect's public command (``prefect server start``: no UI, no scheduler, on a free port of
127.0.0.1), so all of its start-up overlaps the command's own imports and data preparation.
``use()`` then points this process's Prefect client at it, as PREFECT_API_URL. The server's own
output goes to ``local-server.log`` in PREFECT_HOME.

Most of a first start is creating the database, so a new sqlite database is copied from a
template (``cli.database_template``). ``prepare_template()`` (``python -m
cli.local_server``, run by the install) makes the template with a server of its own; a
command that finds none makes it from the database its server has just made.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prefect.context import refresh_global_settings_context
from prefect.settings import get_current_settings
from pydantic import SecretStr

from cifar.errors import PipelineError
from cli import database_template

# A local run's server: no UI, nothing to schedule (a local run has no deployments).
_SERVER_OPTIONS = ("--no-ui", "--no-scheduler", "--no-late-runs", "--analytics-off")
# ... and only the services Prefect's own temporary server runs (the ones recording task runs,
# events and automations): the others watch deployments, work pools and paused or cancelled
# runs of a long-lived server, and their start-up would take CPU from the command's own.
_SERVICES_OFF = {
    f"PREFECT_SERVER_SERVICES_{service}_ENABLED": "false"
    for service in (
        "CANCELLATION_CLEANUP",
        "CLEANUP_RECONCILER",
        "FOREMAN",
        "PAUSE_EXPIRATIONS",
        "REPOSSESSOR",
    )
}
_LOG = "local-server.log"  # in PREFECT_HOME
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): ")  # a traceback's last line
_POLL_S = 0.1
_SQLITE_URL = "sqlite+aiosqlite:///"


class PrefectServerError(PipelineError):
    """Prefect's temporary server (a local run without PREFECT_API_URL) did not start."""


class LocalPrefectServer:
    """Prefect's temporary server in a subprocess; stopped when this process exits."""

    def __init__(
        self,
        environment: dict[str, str],
        timeout_s: float,
        home: str,
        new_database: Path | None = None,
    ) -> None:
        self._environment = environment
        self._home = home
        self._timeout_s = timeout_s
        self._new_database = new_database  # one it makes: the template, once made
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._pointed: dict[str, str] = {}  # environment variables use() set
        self._relaunches = 0
        self._log_start = 0  # where this launch's output begins in the log
        self._launch_error: PrefectServerError | None = None  # raised by wait(), not at start

    @classmethod
    def start(cls) -> LocalPrefectServer | None:
        """Start it unless Prefect's settings name a server, or forbid a temporary one."""
        settings = get_current_settings()
        if settings.api.url or not settings.server.ephemeral.enabled:
            return None
        environment = {
            **os.environ,
            **_SERVICES_OFF,
            **settings.to_environment_variables(exclude_unset=True),
        }
        timeout_s = settings.server.ephemeral.startup_timeout_seconds
        database = _sqlite_file(settings.server.database.connection_url)
        new_database = None
        if database is not None and not database.exists():
            if database_template.copy_to(database):  # its blocks are registered: no check
                environment.setdefault("PREFECT_SERVER_REGISTER_BLOCKS_ON_START", "false")
            else:
                new_database = database  # Prefect makes it
        server = cls(environment, timeout_s, str(settings.home), new_database)
        server._launch()
        atexit.register(server.stop)  # after Prefect's own exit handlers have sent the last logs
        return server

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def use(self) -> None:
        """Wait until the server answers, then make it this process's PREFECT_API_URL."""
        self.wait()
        self._pointed = {"PREFECT_API_URL": self.api_url}
        if "PREFECT_UI_URL" not in os.environ:
            self._pointed["PREFECT_UI_URL"] = ""  # it serves no UI: no "View at" links to it
        os.environ.update(self._pointed)
        refresh_global_settings_context()

    def wait(self) -> None:
        """Wait until the server answers; a database it made is the template if none exists."""
        deadline = time.monotonic() + self._timeout_s
        with httpx.Client() as client:
            while not self._healthy(client):
                if time.monotonic() > deadline:
                    self.stop()
                    raise PrefectServerError(
                        f"Prefect's temporary server did not answer within {self._timeout_s:.0f} "
                        "s. On a busy machine raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_"
                        "SECONDS, or start a server (`prefect server start`) and set "
                        f"PREFECT_API_URL to it.{self._last_output()}"
                    )
                time.sleep(_POLL_S)
        if self._new_database is not None:
            database_template.save_from(self._new_database)  # before any flow runs in it
            self._new_database = None

    def stop(self) -> None:
        """Stop the server (idempotent); Prefect's settings no longer point at it."""
        if self._pointed:
            for name in self._pointed:
                os.environ.pop(name, None)
            self._pointed = {}
            refresh_global_settings_context()
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _launch(self) -> None:
        self.port = _free_port()
        try:
            Path(self._home).mkdir(parents=True, exist_ok=True)
            log = open(Path(self._home, _LOG), "ab")  # noqa: SIM115 (the server writes to it)
        except OSError as exc:
            self._launch_error = PrefectServerError(
                f"Prefect's temporary server cannot write to PREFECT_HOME ({exc}): set "
                "PREFECT_HOME to a folder of yours, or PREFECT_API_URL to a running server."
            )
            return
        with log:
            self._log_start = log.tell()
            self._process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "prefect", "server", "start"),
                    *("--host", "127.0.0.1", "--port", str(self.port)),
                    *("--log-level", "ERROR", *_SERVER_OPTIONS),
                ],
                env=self._environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _healthy(self, client: httpx.Client) -> bool:
        if self._launch_error is not None:
            raise self._launch_error
        if self._process is None:
            raise PrefectServerError("Prefect's temporary server was stopped before it answered.")
        status = self._process.poll()
        if status and not _is_free(self.port) and self._relaunches < 3:
            self._relaunches += 1  # another process took the port between its choice and bind
            self._launch()
            return False
        if status is not None:
            self._process = None
            raise PrefectServerError(
                f"Prefect's temporary server exited with status {status} before it answered. "
                f"If its database in {self._home} is damaged, move that folder away (Prefect "
                "makes a new one), or start a server (`prefect server start`) and set "
                f"PREFECT_API_URL to it.{self._last_output()}"
            )
        try:
            return client.get(f"{self.api_url}/health").status_code == 200
        except httpx.TransportError:
            return False

    def _last_output(self) -> str:
        """What this launch wrote to its log, as a sentence for an error: the last exception it
        printed, else its last lines."""
        try:
            with open(Path(self._home, _LOG), "rb") as log:
                log.seek(self._log_start)
                lines = [line.rstrip() for line in log.read().decode(errors="replace").splitlines()]
        except OSError:
            return ""
        errors = [line for line in lines if _EXCEPTION.match(line)]
        said = errors[-1:] or [line.strip() for line in lines if line.strip()][-3:]
        return f" It said: {' | '.join(said)} ({Path(self._home, _LOG)})" if said else ""


def prepare_template() -> Path:
    """Make this Prefect version's database template (unless it exists) with a server on a
    new PREFECT_HOME."""
    if database_template.path().exists():
        return database_template.path()
    settings = get_current_settings()
    with tempfile.TemporaryDirectory() as home:
        environment = {  # Prefect's defaults, whatever this environment names
            **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
            "PREFECT_HOME": home,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **_SERVICES_OFF,
        }
        timeout_s = max(settings.server.ephemeral.startup_timeout_seconds, 300)
        server = LocalPrefectServer(environment, timeout_s, home)
        server._launch()
        try:
            server.wait()
        finally:
            server.stop()
        database_template.save_from(Path(home, "prefect.db"))
    return database_template.path()


def _sqlite_file(connection_url: object) -> Path | None:
    """The file of a sqlite connection URL (a SecretStr); None for other databases."""
    url = connection_url.get_secret_value() if isinstance(connection_url, SecretStr) else None
    if url is None or not url.startswith(_SQLITE_URL) or ":memory:" in url:
        return None
    return Path(url.removeprefix(_SQLITE_URL).split("?")[0])


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    template = prepare_template()
    if template.exists():
        print(f"Prefect's database template: {template}")
    else:  # the install goes on: each new PREFECT_HOME is migrated, as without a template
        print(f"Prefect's database template could not be written to {template}", file=sys.stderr)
