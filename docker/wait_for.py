#!/usr/bin/env python3
"""Wait until each dependency is ready, then run the command (``exec``).

    python wait_for.py postgres://postgres:5432 prefect-server:4200 -- prefect worker start ...

``HOST:PORT`` is ready when it accepts a TCP connection. ``postgres://HOST:PORT`` is ready when
the server accepts queries, as ``pg_isready`` means it: PostgreSQL accepts TCP connections while
"the database system is starting up" (or shutting down, or recovering), and a service that
connects then fails (Prefect's migrations did, about one start in five). A login refused for
this probe's made-up role is an answer: the server is up. ``http://...`` is ready when it
answers 2xx (a health endpoint). A service whose dependencies start later (podman-compose
does not wait for health) retries within a bound ($WAIT_FOR_TIMEOUT_S, default 180 s) and
then exits with one line naming what it waited for, instead of crash-looping.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.request

NOT_YET = ("starting up", "shutting down", "recovery", "too many clients")


def _tcp(address: str) -> str | None:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return None
    except OSError as error:
        return str(error)


def _postgres(address: str) -> str | None:
    """None once the server accepts queries, else why not (pg_isready's meaning)."""
    import psycopg2

    host, port = address.removeprefix("postgres://").rsplit(":", 1)
    try:
        psycopg2.connect(
            host=host, port=int(port), user="wait_for_probe", dbname="postgres", connect_timeout=3
        ).close()
    except psycopg2.OperationalError as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        refused = "could not connect" in message or "Connection refused" in message
        if refused or any(state in message for state in NOT_YET):
            return message
    return None  # connected, or a login refused: the server answers queries


def _http(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return None if 200 <= response.status < 300 else f"HTTP {response.status}"
    except OSError as error:
        return str(error)


def problem(dependency: str) -> str | None:
    """Why ``dependency`` is not ready yet, or None."""
    if dependency.startswith("postgres://"):
        return _postgres(dependency)
    if dependency.startswith(("http://", "https://")):
        return _http(dependency)
    return _tcp(dependency)


def wait(dependency: str, deadline: float) -> None:
    while (why := problem(dependency)) is not None:
        if time.monotonic() > deadline:
            sys.exit(f"wait_for: {dependency} is not ready ({why}); is it up?")
        time.sleep(1)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    deadline = time.monotonic() + float(os.environ.get("WAIT_FOR_TIMEOUT_S", "180"))
    for dependency in argv[:split]:
        wait(dependency, deadline)
    command = argv[split + 1 :]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
