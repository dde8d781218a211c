"""`make run-offline` as a new user runs it: no PREFECT_API_URL, a new PREFECT_HOME, a new
folder. The command starts Prefect's temporary server itself (cli/local_server.py), records
its flow run there, and leaves no server behind. A new PREFECT_HOME's database is copied from
a template (cli/database_template.py) where there is one."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cli import database_template

REPO = Path(__file__).resolve().parents[2]


def _environment(home: Path, cache: Path) -> dict[str, str]:
    """No PREFECT_API_URL, ``home`` as PREFECT_HOME, ``cache`` as the user's cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    return env | {"PREFECT_HOME": str(home), "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}


def _train_cifar(
    folder: Path, home: Path, cache: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``train-cifar --synthetic --epochs 1`` in ``folder``."""
    return subprocess.run(
        [sys.executable, "-m", "cli.commands", "--synthetic", "--epochs", "1"],
        cwd=folder,
        env=_environment(home, cache),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _template(cache: Path) -> Path:
    """The template a command with ``cache`` as the user's cache uses."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))
        return database_template.path()


def _count(database: Path, table: str) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.fixture(scope="module")
def template_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's cache with the database template the install makes."""
    cache = tmp_path_factory.mktemp("cache")
    env = _environment(tmp_path_factory.mktemp("unused-home"), cache)
    subprocess.run([sys.executable, "-m", "cli.local_server"], env=env, check=True, timeout=240)
    return cache


def test_the_template_is_a_new_prefect_database(template_cache: Path) -> None:
    template = _template(template_cache)
    assert _count(template, "alembic_version") == 1
    assert _count(template, "block_type") > 0
    assert _count(template, "flow_run") == 0


def test_a_new_prefect_home_starts_from_the_template(template_cache: Path, tmp_path: Path) -> None:
    """The server starts on a copy (a table only the template has is there) and runs flows."""
    with sqlite3.connect(_template(template_cache)) as db:
        db.execute("CREATE TABLE IF NOT EXISTS copied_from_the_template (x)")
    home = tmp_path / "prefect-home"
    script = (
        "from prefect import flow\n"
        "from cli.local_server import LocalPrefectServer\n"
        "LocalPrefectServer.start().use()\n"
        "assert flow(name='hello')(lambda: 1)() == 1\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_environment(home, template_cache),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert _count(home / "prefect.db", "copied_from_the_template") == 0
    assert _count(home / "prefect.db", "flow_run") == 1
    assert _servers_of(home) == []


def test_train_cifar_runs_on_prefects_temporary_server(tmp_path: Path) -> None:
    """With a damaged template, as with none: Prefect makes the database, and it becomes the
    template before the flow runs in it."""
    home, cache = tmp_path / "prefect-home", tmp_path / "cache"
    _template(cache).parent.mkdir(parents=True)
    _template(cache).write_text("not a database")
    done = _train_cifar(tmp_path, home, cache, timeout_s=240)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["model_version"] == "1" and summary["alias"] == "champion"
    with sqlite3.connect(home / "prefect.db") as db:
        runs = db.execute(
            "SELECT flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = "
            "flow_run.flow_id"
        ).fetchall()
    assert runs == [("train-cifar", "COMPLETED")]
    assert _count(_template(cache), "alembic_version") == 1
    assert _count(_template(cache), "flow_run") == 0
    output = done.stdout + done.stderr
    for unwanted in ("Traceback", "Error logging to API", "View at"):
        assert unwanted not in output, output
    assert _servers_of(home) == []


def test_train_cifar_explains_a_temporary_server_that_cannot_start(tmp_path: Path) -> None:
    """A damaged database in PREFECT_HOME: one paragraph naming it and quoting the server's
    own output, at once (an exit while the port is free is not taken for a port in use), no
    server left, nothing trained."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    (home / "prefect.db").write_text("not a database")
    done = _train_cifar(tmp_path, home, tmp_path, timeout_s=60)  # the startup timeout is 90 s
    assert done.returncode == 1
    paragraph = done.stderr.strip().splitlines()[-1]
    assert paragraph.startswith("Prefect's temporary server exited with status 3"), paragraph
    assert f"If its database in {home} is damaged, move that folder away" in paragraph
    assert "It said: sqlalchemy.exc.DatabaseError: " in paragraph
    assert "Traceback" not in paragraph
    assert _servers_of(home) == []
    assert not (tmp_path / "cifar-data" / "datasets").exists()


def _servers_of(home: Path) -> list[int]:
    """Prefect servers (``prefect server start``) still running on ``home``."""
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        cmdline, environ = process.info["cmdline"] or [], process.info["environ"] or {}
        serving = cmdline[1:5] == ["-m", "prefect", "server", "start"]
        if serving and environ.get("PREFECT_HOME") == str(home):
            found.append(process.pid)
    return found


def test_a_mistyped_option_fails_before_anything_starts(tmp_path: Path) -> None:
    """argparse's message and status 2, with no server started and nothing written."""
    folder, home = tmp_path / "folder", tmp_path / "prefect-home"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "cli.commands", "--synthetic", "--epochz", "1"],
        cwd=folder,
        env=_environment(home, tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "train-cifar: error: unrecognized arguments: --epochz 1" in done.stderr
    assert list(folder.iterdir()) == [] and not home.exists()
