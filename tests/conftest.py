"""Shared fixtures, one per service: a Dask LocalCluster, a PostgreSQL server and a Prefect
server on it, an MLflow store, two S3 endpoints (SeaweedFS where credentials must be checked,
moto's server for the rest), an HTTP file server and a SLURM cluster."""

from __future__ import annotations

import faulthandler
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pytest
from distributed import Client

from tests import process_guard
from tests.helpers import (
    SESSION_VARIABLE,
    free_port,
    http_server,
    local_cluster,
    rank_processes,
    skip_or_fail,
)
from tests.postgres_rig import Postgres, postgres_server
from tests.postgres_rig import unavailable_reason as postgres_unavailable
from tests.prefect_stack import prefect_stack
from tests.slurm_rig import SlurmCluster, slurm_cluster, unavailable_reason

if TYPE_CHECKING:
    import s3fs

    from tests.s3_rig import SeaweedServer

S3_BUCKET = "trainlib-test"
os.environ[SESSION_VARIABLE] = uuid.uuid4().hex  # marks this session's rank processes
# Fixtures that start a server, a cluster or rank processes: a test using one is an
# integration test (``make test-fast`` leaves those out, as it does *_integration.py files).
STARTS_SERVERS = {
    "dask_client",
    "postgres",
    "prefect_env",
    "prefect_server",
    "slurm",
    "s3_filesystem",
    "checked_s3",
}


# Files that take minutes, run first: `make test` spreads files over two pytest-xdist workers,
# and one started last would run alone at the end.
LONGEST = ("test_soak_integration", "test_alerts_integration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.stem.endswith("_integration") or fixtures & STARTS_SERVERS:
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.path.stem not in LONGEST)  # stable: the rest keep order


@pytest.fixture(autouse=True)
def _a_unit_test_starts_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test ``make test-fast`` runs starts no process (``tests/process_guard.py``)."""
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    started: list[str] = []
    with process_guard.watching(started):
        yield
    assert not started, (
        f"{request.node.nodeid} is not marked integration but started {started}: mark it "
        "(pytest.mark.integration on it or its module, or a fixture in STARTS_SERVERS)"
    )


@pytest.fixture(scope="session", autouse=True)
def command_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The commands' log file in a temporary folder, not in the working directory."""
    path = tmp_path_factory.mktemp("logs") / "command.log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CIFAR_LOG_FILE", str(path))
        yield path


@pytest.fixture(scope="session", autouse=True)
def prefect_logging_outside_any_test() -> None:
    """Prefect's console handler is made once per process, on the ``sys.stderr`` of that moment:
    made inside a test's ``capsys``, it wrote to a closed file in every later test (the
    commands' "no traceback" checks then failed, depending on which test ran first). Where
    Prefect is not installed (a bare GPU host: ``make gpu-check``) there is nothing to set up."""
    try:
        from prefect.logging.configuration import ensure_logging_setup
    except ModuleNotFoundError:
        return

    ensure_logging_setup()


@pytest.fixture(scope="session")
def _terminal_stderr(request: pytest.FixtureRequest) -> Iterator[TextIO]:
    """The session's real stderr (pytest captures fd 2 around each test)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture()
    try:
        stream = os.fdopen(os.dup(2), "w")
    finally:
        if capture is not None:
            capture.resume_global_capture()
    with stream:
        yield stream


@pytest.fixture(autouse=True)
def frozen_process_watchdog(
    request: pytest.FixtureRequest, _terminal_stderr: TextIO
) -> Iterator[None]:
    """A test still running 60 s past its pytest-timeout dumps every thread's stack to the
    terminal and ends the session. pytest-timeout's alarm is a Python signal handler: it never
    runs while the process is frozen (a thread holding the GIL in a C call), which once left a
    full run hanging without a word; faulthandler's watchdog is a C thread that needs no GIL."""
    marker = request.node.get_closest_marker("timeout")
    configured = marker.args[0] if marker and marker.args else request.config.getini("timeout")
    limit = float(configured or 0)
    if limit <= 0:
        yield
        return
    faulthandler.dump_traceback_later(limit + 60, exit=True, file=_terminal_stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def no_leftover_ranks() -> Iterator[None]:
    """No rank process of this session is left once the test ends (a file that starts ranks
    uses it: ``pytestmark = pytest.mark.usefixtures("no_leftover_ranks")``)."""
    yield
    assert rank_processes() == []


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Client]:
    """A 2-worker LocalCluster shared by the tests, as a user's long-lived cluster would be."""
    with local_cluster(2, processes=True) as client:
        yield client


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL server for the session (Debian's package; skipped, saying why, where it is
    not installed, and failing instead in CI)."""
    if (reason := postgres_unavailable()) is not None:
        skip_or_fail(reason)
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def prefect_env(
    postgres: Postgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Environment of a running Prefect server (on PostgreSQL) with a process work pool and
    worker."""
    database = postgres.create_database("prefect")
    with prefect_stack(tmp_path_factory.mktemp("prefect-home"), database) as env:
        yield env


@pytest.fixture(scope="session")
def prefect_server(prefect_env: dict[str, str]) -> Iterator[None]:
    """This process's flows report to the session's Prefect server (one server per session)."""
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_env["PREFECT_API_URL"]}):
        yield
        # Send the flows' queued logs while the server is up: left for the interpreter's
        # exit, they were retried against a stopped server for 90 s (seen once).
        APILogHandler().flush()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real SLURM controller and node (2 cores), with ``SLURM_CONF`` pointing at it while
    the session lasts: dask-jobqueue's ``sbatch``/``squeue``/``scancel`` reach it.

    Skipped, saying why, where SLURM is not installed or the tests do not run as root; in CI
    (``CI=true``) that fails the tests instead of silently dropping them."""
    if (reason := unavailable_reason()) is not None:
        skip_or_fail(reason)
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        saved = os.environ.get("SLURM_CONF")
        os.environ.update(cluster.env)
        try:
            yield cluster
        finally:
            if saved is None:
                del os.environ["SLURM_CONF"]
            else:
                os.environ["SLURM_CONF"] = saved


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An MLflow store (SQLite) shared by a module's tests (a store takes seconds to create),
    while MLflow's process-wide URI points at another one that nothing may use."""
    import mlflow

    root = tmp_path_factory.mktemp("mlflow")
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{root}/elsewhere.db")
    try:
        yield f"sqlite:///{root}/mlflow.db"
    finally:
        mlflow.set_tracking_uri(before)
    assert not (root / "elsewhere.db").exists()  # nothing used the process-wide setting


@pytest.fixture
def fresh_tracking_uri(tmp_path: Path) -> str:
    """An MLflow store of one test's own, for tests that count what a store holds."""
    return f"sqlite:///{tmp_path}/mlflow.db"


@pytest.fixture(scope="session")
def checked_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """Real S3 that checks credentials (SeaweedFS, ``tests/s3_rig.py``), with bucket
    ``s3_rig.BUCKET``: for tests of wrong credentials, error answers and slow storage."""
    from tests.s3_rig import SeaweedServer  # s3fs: not on a GPU host with trainlib's alone

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_filesystem() -> Iterator[s3fs.S3FileSystem]:
    """An S3 filesystem on a moto server listening on a free local port, with one bucket: for
    tests where S3 only has to store and serve (moto accepts any credentials)."""
    import s3fs  # here, not at the top: a GPU host with only trainlib's packages runs the rest
    from moto.server import ThreadedMotoServer

    port = free_port()
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


@dataclass(frozen=True)
class HttpDir:
    """A local directory served over HTTP."""

    path: Path
    url: str


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def http_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDir]:
    """Files in a directory, served by a real HTTP server on a free local port."""
    root = tmp_path_factory.mktemp("http")
    with http_server(partial(_QuietHandler, directory=str(root))) as url:
        yield HttpDir(root, url)


@dataclass
class ScriptedHttp:
    """An HTTP server (no Range support) that answers with scripted statuses, then the file."""

    url: str
    statuses: list[int]
    requests: list[str]


@pytest.fixture
def scripted_http(http_dir: HttpDir) -> Iterator[ScriptedHttp]:
    """Serves ``http_dir``'s files; while ``statuses`` is not empty, each request gets the next
    status instead (e.g. 503, 429, 404)."""
    script = ScriptedHttp("", [], [])

    class Handler(_QuietHandler):
        def _scripted(self) -> bool:
            script.requests.append(self.command)
            if not script.statuses:
                return False
            self.send_error(script.statuses.pop(0))
            return True

        def do_GET(self) -> None:
            if not self._scripted():
                super().do_GET()

        def do_HEAD(self) -> None:
            if not self._scripted():
                super().do_HEAD()

    with http_server(partial(Handler, directory=str(http_dir.path))) as script.url:
        yield script
