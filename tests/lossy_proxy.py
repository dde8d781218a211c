"""An HTTP proxy in front of a real server that loses chosen replies: the server gets the
request and acts on it, the client gets no answer (the connection closes), as when a network,
a load balancer or a restarting server fails between the two. No part of the server is faked."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from tests.helpers import http_server

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class LossyProxy:
    """Forwards every request to ``target``; loses the reply to the first ``times`` requests
    whose path ends with ``path_suffix``. ``seen`` counts those requests."""

    def __init__(self, target: str, path_suffix: str, times: int = 1) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.path_suffix, self.times = path_suffix, times
        self.seen = 0
        self._lock = threading.Lock()

    def arm(self) -> None:
        """Lose the reply to the next matching request too."""
        with self._lock:
            self.times = max(self.times, self.seen) + 1

    @property
    def armed(self) -> bool:
        """Whether a matching request's reply is still to be lost."""
        with self._lock:
            return self.seen < self.times

    def lose(self, path: str) -> bool:
        """Whether the reply to this request is lost (counting it)."""
        if not path.split("?", 1)[0].endswith(self.path_suffix):
            return False
        with self._lock:
            self.seen += 1
            return self.seen <= self.times


def _handler(proxy: LossyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream = http.client.HTTPConnection(*proxy.target, timeout=120)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                content = reply.read()
            except OSError:  # the server is down: a load balancer's answer
                self.send_error(502, "Bad Gateway")
                return
            finally:
                upstream.close()
            if proxy.lose(self.path):
                self.close_connection = True  # the server acted; the client hears nothing
                return
            self.send_response(reply.status, reply.reason)
            for key, value in reply.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests read the server's records, not the proxy's."""

    return Handler


@contextmanager
def lossy_proxy(target: str, path_suffix: str, times: int = 1) -> Iterator[tuple[str, LossyProxy]]:
    """A ``LossyProxy`` listening on a free local port until the block ends: its URL and it."""
    proxy = LossyProxy(target, path_suffix, times)
    with http_server(_handler(proxy)) as url:
        yield url, proxy
