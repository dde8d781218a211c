#!/usr/bin/env python3
"""Wait until each HOST:PORT accepts a TCP connection, then run the command (``exec``).

    python wait_for.py prefect-server:4200 mlflow:5000 -- prefect worker start ...

A service whose dependencies start later (podman-compose does not wait for health) retries
within a bound ($WAIT_FOR_TIMEOUT_S, default 180 s) and then exits with one line naming what it
waited for, instead of crash-looping.
"""

from __future__ import annotations

import os
import socket
import sys
import time


def wait(address: str, deadline: float) -> None:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError as error:
            if time.monotonic() > deadline:
                sys.exit(f"wait_for: {address} did not accept connections ({error}); is it up?")
            time.sleep(1)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    deadline = time.monotonic() + float(os.environ.get("WAIT_FOR_TIMEOUT_S", "180"))
    for address in argv[:split]:
        wait(address, deadline)
    command = argv[split + 1 :]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
