"""Shared fixtures: a real Dask LocalCluster and a real S3 endpoint (moto's server) over HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import s3fs
from distributed import Client, LocalCluster
from moto.server import ThreadedMotoServer

S3_BUCKET = "trainlib-test"


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Client]:
    """A 2-worker LocalCluster shared by the tests, as a user's long-lived cluster would be."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="session")
def s3_filesystem() -> Iterator[s3fs.S3FileSystem]:
    """An S3 filesystem on a moto server listening on a free local port, with one bucket."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        fs = s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"},
        )
        fs.mkdir(S3_BUCKET)
        yield fs
    finally:
        server.stop()
