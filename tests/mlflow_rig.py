"""A real MLflow tracking server for tests, on a free port, its store in a folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import free_port

STARTUP_S = 120.0


@contextmanager
def mlflow_server(root: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``mlflow server`` with its sqlite store in ``root`` and ``options`` (e.g.
    ``--artifacts-destination s3://...``, ``--app-name basic-auth``), until the block ends: its
    URL. ``env``: more environment for the server."""
    port = free_port()
    environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    log = root / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "mlflow", "server"),
                *("--backend-store-uri", f"sqlite:///{root}/mlflow.db"),
                *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
                *options,
            ],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"MLflow server did not start:\n{log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
