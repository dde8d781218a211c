"""A real PostgreSQL server for tests: Debian's ``postgresql`` package, one cluster in a
temporary folder on a free port, torn down afterwards.

The server refuses to run as root, so as root it runs as the ``postgres`` user the package
creates (otherwise as ourselves). The postmaster is our own child process, in the foreground:
stopping it leaves nothing behind. Connections over the Unix socket (the superuser's) are
trusted; connections over TCP, as the services make them, need their role's password.
``make test`` installs the package as root (``apt-get install -y postgresql``).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import free_port

STARTUP_S = 60.0
STOP_S = 30.0
INSTALL_HINT = "apt-get install -y postgresql"
SERVER_USER = "postgres"  # the account Debian's package makes; used when we are root


def _bindir() -> Path | None:
    """The newest installed server's binaries (Debian keeps them per major version)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3])
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


def unavailable_reason() -> str | None:
    """Why no test server can run here, or None."""
    if _bindir() is None:
        return f"PostgreSQL is not installed ({INSTALL_HINT}, as root; `make test` does it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"the {SERVER_USER!r} user is missing (it comes with {INSTALL_HINT})"
    return None


class Postgres:
    """A running test server (its cluster in ``socket_dir``/data); ``restart`` stops it (fast
    shutdown: clients are cut off) and starts it again on the same port and data."""

    def __init__(self, port: int, socket_dir: Path, bindir: Path) -> None:
        self.port, self.socket_dir, self.bindir = port, socket_dir, bindir
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.socket_dir / "server.log"
        with open(log, "ab") as out:
            self._process = subprocess.Popen(
                [
                    *(str(self.bindir / "postgres"), "-D", str(self.socket_dir / "data")),
                    *("-p", str(self.port), "-k", str(self.socket_dir)),
                    *("-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"),
                    *("-c", "fsync=off"),  # tests only: a crash of the machine may lose writes
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                **_as_server_user(),  # type: ignore[arg-type]
            )
        _wait_ready(self.bindir, self.socket_dir, self.port, self._process, log)

    def stop(self) -> None:
        server, self._process = self._process, None
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, then exit
            try:
                server.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def sql(self, *statements: str, database: str = "postgres") -> str:
        """Run statements as the superuser (each in its own transaction); their output."""
        argv = [str(self.bindir / "psql"), "-h", str(self.socket_dir), "-p", str(self.port)]
        argv += ["-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-At"]
        for statement in statements:
            argv += ["-c", statement]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def create_database(self, name: str) -> str:
        """A new role and a database it owns, both named ``name``, with a random password:
        the SQLAlchemy URL of the database (``postgresql://name:password@127.0.0.1:port/name``)."""
        password = secrets.token_hex(12)
        self.sql(
            f"CREATE ROLE {name} LOGIN PASSWORD '{password}'",
            f"CREATE DATABASE {name} OWNER {name}",
        )
        return f"postgresql://{name}:{password}@127.0.0.1:{self.port}/{name}"


def _as_server_user() -> dict[str, object]:
    """Popen arguments that run a process as the server's account when we are root."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam(SERVER_USER)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A fresh cluster, serving on 127.0.0.1 and a Unix socket in its folder until the block
    ends; then stopped (fast shutdown) and its folder removed. The folder is a new one under
    the system's temporary folder: the server's account must be able to reach it."""
    bindir = _bindir()
    if bindir is None:
        raise RuntimeError(unavailable_reason())
    root = Path(tempfile.mkdtemp(prefix="trainlib-pg-"))
    owner = _as_server_user()
    if owner:
        os.chown(root, int(owner["user"]), int(owner["group"]))  # type: ignore[call-overload]
    data = root / "data"
    initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8"]
    subprocess.run(
        [*initdb, "--auth-local=trust", "--auth-host=scram-sha-256"],
        capture_output=True,
        check=True,
        timeout=120,
        **owner,  # type: ignore[arg-type]
    )
    server = Postgres(free_port(), root, bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(
    bindir: Path, socket_dir: Path, port: int, server: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + STARTUP_S
    ready = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]
    while subprocess.run(ready, check=False).returncode != 0:
        if server.poll() is not None:
            raise RuntimeError(f"postgres exited with {server.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"postgres not ready after {STARTUP_S} s:\n{log.read_text()}")
        time.sleep(0.1)
