"""A real MLflow tracking server for tests, on a free port, its store in a folder; it can be
stopped and started again on the same port and store (an outage)."""

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


class MlflowServer:
    """``mlflow server`` with its store (``backend``: a database URL; default a sqlite file in
    ``root``) and ``options`` (e.g. ``--artifacts-destination s3://...``, ``--app-name
    basic-auth``); ``env``: more environment for the server."""

    def __init__(
        self,
        root: Path,
        *options: str,
        env: dict[str, str] | None = None,
        port: int = 0,
        backend: str | None = None,
    ) -> None:
        self.root = root
        self.backend = backend or f"sqlite:///{root}/mlflow.db"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._options = options
        self._env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server and wait until it answers."""
        log = self.root / "server.log"
        with open(log, "ab") as out:
            self._process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "mlflow", "server"),
                    *("--backend-store-uri", self.backend),
                    *("--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"),
                    *self._options,
                ],
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"MLflow server did not start:\n{log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server (its port refuses connections until ``start``)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=30)
        self._process = None


@contextmanager
def mlflow_server(root: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """An ``MlflowServer`` running until the block ends: its URL."""
    server = MlflowServer(root, *options, env=env)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
