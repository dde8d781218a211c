"""Helpers shared by tests (not fixtures)."""

from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, NoReturn

import psutil
import pytest
from distributed import Client, LocalCluster, Scheduler, SpecCluster, Worker

WAIT_S = 60.0


def skip_or_fail(reason: str) -> NoReturn:
    """Skip a test this machine cannot run (not root, a system package missing), saying why;
    in CI (``CI=true``), which installs everything as root, fail instead: CI never silently
    loses a test."""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{reason}; CI (CI=true) must run this test")
    pytest.skip(reason)


# Set once per test session (tests/conftest.py) and inherited by everything it starts: Dask
# workers, fork servers, ranks, drivers run as scripts. Other jobs on this machine (another
# checkout's tests, a user's runs) have other values or none, so they are never counted.
SESSION_VARIABLE = "TRAINLIB_TEST_SESSION"


def rank_processes() -> list[psutil.Process]:
    """Rank processes of this test session launched and still alive (a worker's idle rank
    process, still waiting for its launch, is not counted: see
    ``trainlib._internal.worker.rank_pool``)."""
    return [p for p in trainlib_processes() if _name(p) == "trainlib-rank"]


def trainlib_processes() -> list[psutil.Process]:
    """Every rank process of this test session alive now: at work, or idle in a worker's
    pool."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "trainlib._internal.rank.rank_main" in cmdline and _of_this_session(process):
            found.append(process)
    return found


def _of_this_session(process: psutil.Process) -> bool:
    try:
        return bool(process.environ().get(SESSION_VARIABLE) == os.environ[SESSION_VARIABLE])
    except (psutil.Error, KeyError):  # gone, a zombie, another user's, or no session here
        return False


def _name(process: psutil.Process) -> str:
    try:
        return str(process.name())
    except psutil.NoSuchProcess:
        return ""


@contextmanager
def http_server(handler: Callable[..., BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` answering on a free local port, a thread per request, until the block ends:
    the server's URL (``http://127.0.0.1:PORT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def local_cluster(n_workers: int, processes: bool) -> Iterator[Client]:
    """A client of a LocalCluster of single-threaded workers, closed afterwards (``n_workers=0``:
    a scheduler alone, for a test that starts its own workers)."""
    with (
        LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=processes, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@contextmanager
def mixed_cluster(workers: dict[str, dict[str, Any]]) -> Iterator[tuple[Client, dict[str, str]]]:
    """A client of a cluster (in this process) of single-threaded workers, each with its own
    options (``resources``), and each worker's address by name."""
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": ":0"}}
    specs = {
        name: {"cls": Worker, "options": {"nthreads": 1, **options}}
        for name, options in workers.items()
    }
    with SpecCluster(workers=specs, scheduler=scheduler) as cluster, Client(cluster) as client:
        yield client, {name: worker.address for name, worker in cluster.workers.items()}


def free_port() -> int:
    """A TCP port free on 127.0.0.1, reserved for this test session (``free_ports``)."""
    return free_ports((0,))


def free_ports(offsets: Sequence[int]) -> int:
    """A base port B with every ``B + offset`` free on 127.0.0.1 and reserved for this test
    session, for a server to bind later.

    A port from ``bind(0)``, released for the server, is an ephemeral port: an outgoing
    connection of any process may be given it before the server binds it. These come from
    below the kernel's ephemeral range instead, which no connection is given, and a lock
    file per port (held until the session ends) keeps other test sessions on this host, and
    this one, from handing out the same port twice.
    """
    low, high = _RESERVABLE
    span = max(offsets)
    for _ in range(500):
        base = random.randrange(low, high - span)
        locks = [_lock_port(base + offset) for offset in offsets]
        held = [lock for lock in locks if lock is not None]
        if len(held) == len(locks) and all(_bindable(base + o) for o in offsets):
            _RESERVED.extend(held)
            return base
        for lock in held:
            lock.close()  # drops its flock
    raise RuntimeError(f"no free ports {list(offsets)} from a base in {low}..{high}")


def _reservable_range() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range (Linux's ``ip_local_port_range``)."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768  # Linux's default
    return 10000, max(first, 12000)


_RESERVABLE = _reservable_range()
_RESERVED: list[IO[bytes]] = []  # the lock files of this session's ports, held to its end
_PORT_LOCKS = Path(tempfile.gettempdir()) / "trainlib-test-ports"


def _lock_port(port: int) -> IO[bytes] | None:
    _PORT_LOCKS.mkdir(exist_ok=True)
    lock = open(_PORT_LOCKS / str(port), "ab")  # noqa: SIM115 (held for the session)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for_path(path: Path, timeout_s: float = WAIT_S) -> None:
    """Block until ``path`` exists (another process makes it), or raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.05)


def set_single_rank_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment as a supervisor sets it for rank 0 of a group of one."""
    from trainlib._internal.driver.run_plan import find_free_port, rank_environment

    environment = rank_environment(
        world_rank=0,
        local_rank=0,
        node_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=find_free_port(),
    )
    for name, value in environment.items():
        monkeypatch.setenv(name, value)


def single_rank_spec(storage: Any, dataset_names: tuple[str, ...] = ()) -> Any:
    """The ``RankSpec`` of rank 0 of a group of one on ``storage`` (a ``RunStorage``), for a
    session made in this process."""
    from trainlib._internal.common.messages import RankSpec

    return RankSpec(
        world_rank=0,
        local_rank=0,
        node_rank=0,
        world_size=1,
        local_world_size=1,
        host="localhost",
        backend="gloo",
        timeout_s=60,
        use_gpu=False,
        run_name="run",
        storage=storage,
        start_index=0,
        latest_checkpoint=None,
        train_func_payload=b"",
        dataset_names=dataset_names,
    )


def run_script_for_result(
    script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a ported example in a fresh Python; it must exit 0 and print ``RESULT <json>``."""
    done = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def working_ranks(dask_client: Client) -> list[psutil.Process]:
    """The rank processes at work under the cluster's workers (idle warm ones are not)."""
    workers = [psutil.Process(pid) for pid in dask_client.run(os.getpid).values()]
    return [
        child
        for worker in workers
        for child in worker.children(recursive=True)
        if child.is_running() and child.status() != "zombie" and child.name() == "trainlib-rank"
    ]
