"""The tests' alert webhook inside the stack: every POSTed JSON body printed to stdout as one
line (``podman logs`` reads them), 200 to each. Runs in the services image (compose.test.yml),
on the networks of what sends alerts (the Prefect server, the sentinel)."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 8080


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            received = json.loads(body or b"{}")
        except ValueError:
            received = {"unreadable": body.decode(errors="replace")}
        print(json.dumps(received), flush=True)  # not the path: its token is a credential
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    print("listening", flush=True, file=sys.stderr)
    ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
