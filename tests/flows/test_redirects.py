"""Redirects of the URLs a run names, against a real HTTP server: each hop is checked by the run
policy before it is followed (generated chains of hops, allowed and refused), and the download
then follows none."""

from __future__ import annotations

import os
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cifar.format import write_synthetic_archive
from flows.places import PolicyError
from flows.redirects import MAX_REDIRECTS, final_url
from flows.run_policy import RunPolicy
from tasks.download import Retry, download_archive
from tasks.download_failures import DownloadError
from tasks.layout import StorageLayout
from tests.helpers import http_server

# Where a hop may point: this server's own paths (allowed), and places a policy that reads only
# this server refuses.
REFUSED = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://[fe80::1]/x",
    "file:///proc/self/environ",
    "file:///run/secrets/alerts_url",
    "s3://mlflow/artifacts/model.pth",
    "http://127.0.0.2:1/elsewhere",  # another host: not in `read`
]


class Server:
    """Answers /hop/<i> with a redirect to ``chain[i]`` and anything else with ``body``."""

    def __init__(self) -> None:
        self.chain: list[str] = []
        self.requests: list[str] = []
        self.url = ""
        self.body = b"data"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            state.requests.append(self.path)
            if self.path.startswith("/hop/"):
                self.send_response(302)
                self.send_header("Location", state.chain[int(self.path.split("/")[2])])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with http_server(Handler) as url:
        state.url = url
        yield state


def _policy(server: Server) -> RunPolicy:
    return RunPolicy(source="policy.toml", read=(f"{server.url}/",), write=(), servers={})


def _hop(index: int, relative: bool, server: Server) -> str:
    return f"/hop/{index}" if relative else f"{server.url}/hop/{index}"


@settings(
    derandomize=True,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    hops=st.lists(st.booleans(), max_size=MAX_REDIRECTS + 2),  # each: relative or absolute
    refused=st.none() | st.tuples(st.integers(0, MAX_REDIRECTS + 1), st.sampled_from(REFUSED)),
)
def test_redirects_every_hop_is_checked_before_it_is_followed(
    server: Server, hops: list[bool], refused: tuple[int, str] | None
) -> None:
    chain = [_hop(i + 1, relative, server) for i, relative in enumerate(hops)]
    chain[-1:] = [f"{server.url}/final.tar.gz"] if chain else []
    if refused is not None and chain:
        at = refused[0] % len(chain)
        chain[at] = refused[1]
    server.chain[:] = chain
    server.requests.clear()
    start = f"{server.url}/hop/0" if chain else f"{server.url}/final.tar.gz"
    first_refused = next((i for i, to in enumerate(chain) if to in REFUSED), None)
    if first_refused is not None and first_refused <= MAX_REDIRECTS:
        with pytest.raises(PolicyError) as caught:
            final_url("data_url", start, _policy(server))
        assert f"redirects to {chain[first_refused]!r}" in str(caught.value)
        assert len(server.requests) == first_refused + 1  # nothing after the refused hop
    elif len(chain) > MAX_REDIRECTS:
        with pytest.raises(PolicyError, match=f"redirects more than {MAX_REDIRECTS} times"):
            final_url("data_url", start, _policy(server))
    else:
        assert final_url("data_url", start, _policy(server)) == f"{server.url}/final.tar.gz"


def test_redirects_to_metadata_are_refused_without_a_policy_file_too(server: Server) -> None:
    server.chain[:] = [REFUSED[0]]
    with pytest.raises(PolicyError, match="link-local address"):
        final_url("data_url", f"{server.url}/hop/0", RunPolicy())


def test_redirects_not_http_and_unreachable_urls_are_left_to_the_download(
    tmp_path: Path,
) -> None:
    policy = RunPolicy()
    for url in (str(tmp_path / "a.tar.gz"), "s3://cifar/a.tar.gz", "http://127.0.0.1:9/a"):
        assert final_url("data_url", url, policy) == url


def test_redirects_the_download_follows_none_and_stores_nothing(
    server: Server, tmp_path: Path
) -> None:
    """A server that redirects only when the download reads (after the flow's check)."""
    archive = tmp_path / "served.tar.gz"
    write_synthetic_archive(str(archive), images_per_batch=20)
    server.chain[:] = ["http://169.254.169.254/latest/meta-data/"]
    layout = StorageLayout.at(str(tmp_path / "store"))
    with pytest.raises(DownloadError, match=r"redirected to 'http://169\.254\.169\.254") as caught:
        download_archive(f"{server.url}/hop/0", layout, None, Retry(tries=3, backoff_s=0.01))
    assert not caught.value.transient and caught.value.tries == 1
    assert os.listdir(tmp_path / "store" / "raw") == []
