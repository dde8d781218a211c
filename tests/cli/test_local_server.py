"""The local Prefect server's own logic, with stand-in processes instead of Prefect's server:
when one starts, how its failures read, that nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import prefect
import pytest
from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings
from pydantic import SecretStr

from cli import local_server
from cli.local_server import LocalPrefectServer, PrefectServerError

# Answers 200 to every GET, as Prefect's /api/health does once the server is up.
HEALTHY = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


class StandIn(LocalPrefectServer):
    """The server's lifecycle around a process running ``code`` (argv[1]: the port)."""

    def __init__(self, code: str, timeout_s: float = 60.0) -> None:
        super().__init__(dict(os.environ), timeout_s, home="/nowhere")
        self._code = code

    def _launch(self) -> None:
        self.port = local_server._free_port()
        self._process = subprocess.Popen([sys.executable, "-c", self._code, str(self.port)])

    @property
    def process(self) -> object:
        return self._process


def _global_api_url() -> str | None:
    """The API URL of Prefect's global settings (a session fixture's may override it)."""
    from prefect import context

    return context.GLOBAL_SETTINGS_CONTEXT.settings.api.url


def test_no_server_is_started_when_prefect_names_one() -> None:
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert LocalPrefectServer.start() is None


@pytest.mark.parametrize(
    ("url", "file"),
    [
        ("sqlite+aiosqlite:////home/u/.prefect/prefect.db", Path("/home/u/.prefect/prefect.db")),
        ("sqlite+aiosqlite:///rel/prefect.db?timeout=5", Path("rel/prefect.db")),
        ("sqlite+aiosqlite:///:memory:", None),
        ("postgresql+asyncpg://u:p@db/prefect", None),
    ],
)
def test_the_database_file_is_read_from_the_connection_url(url: str, file: Path | None) -> None:
    assert local_server._sqlite_file(SecretStr(url)) == file


def test_the_default_database_is_a_sqlite_file_under_prefect_home() -> None:
    settings = get_current_settings()
    file = local_server._sqlite_file(settings.server.database.connection_url)
    assert file is not None and file.parent == Path(settings.home)


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_a_server_that_exits_says_so_and_how_to_recover() -> None:
    server = StandIn("import sys; sys.exit(1)")
    server._launch()
    with pytest.raises(PrefectServerError, match="exited with status 1 before it answered") as err:
        server.wait()
    assert "move that folder away" in str(err.value) and "/nowhere" in str(err.value)


def test_a_prefect_home_it_cannot_write_is_named_when_the_command_waits() -> None:
    server = LocalPrefectServer(dict(os.environ), 5.0, home="/proc/no-such-home")
    server._launch()  # at the command's start: nothing raised yet
    with pytest.raises(PrefectServerError, match=r"cannot write to PREFECT_HOME .*no-such-home"):
        server.wait()


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_a_server_that_never_answers_is_stopped_after_the_timeout() -> None:
    server = StandIn("import time; time.sleep(60)", timeout_s=0.5)
    server._launch()
    process = server.process
    with pytest.raises(PrefectServerError, match="did not answer within 0 s"):
        server.wait()
    assert process.poll() is not None  # type: ignore[attr-defined]  # stopped, not orphaned


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_use_points_prefect_at_the_server_and_stop_undoes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    server = StandIn(HEALTHY)
    server._launch()
    process = server.process
    try:
        server.use()
        assert os.environ["PREFECT_API_URL"] == f"http://127.0.0.1:{server.port}/api"
        assert _global_api_url() == server.api_url
    finally:
        server.stop()
    assert "PREFECT_API_URL" not in os.environ and "PREFECT_UI_URL" not in os.environ
    assert _global_api_url() is None
    assert process.poll() is not None  # type: ignore[attr-defined]
    server.stop()  # idempotent


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_prefects_server_command_still_takes_the_options_the_local_server_gives_it() -> None:
    """Fails, naming the option, on the first Prefect release whose ``prefect server start``
    drops one (the local server would otherwise fail at every command's start)."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "server", "start", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    missing = [option for option in local_server._SERVER_OPTIONS if option not in done.stdout]
    assert missing == [], (
        f"Prefect {prefect.__version__}'s `prefect server start` has no {missing}: update "
        "cli/local_server.py"
    )


def test_the_services_switched_off_are_prefects_settings() -> None:
    """Fails on the first Prefect that renames one (its variable would be ignored, and the
    service would take CPU from every command's start-up again)."""
    services = get_current_settings().server.services
    prefix, suffix = "PREFECT_SERVER_SERVICES_", "_ENABLED"
    names = [
        v.removeprefix(prefix).removesuffix(suffix).lower() for v in local_server._SERVICES_OFF
    ]
    assert [name for name in names if not hasattr(services, name)] == []
