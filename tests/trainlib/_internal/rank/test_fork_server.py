"""A worker's fork server, spoken to directly: it forks a rank per request, passes its socket,
and reports how each rank ended, with pidfds (Linux) and without them (other systems)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

import psutil
import pytest

from trainlib._internal.common.messages import Forked, ForkRequest, RankExited

pytestmark = pytest.mark.integration  # starts processes (tests/process_guard.py)

EXIT_ORPHANED = 70  # rank_main: never launched, its worker's end closed


@pytest.fixture(params=["pidfd", "no pidfd"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Connection, int]]:
    """A fork server started as a worker starts one; "no pidfd" hides ``os.pidfd_open``."""
    hide = "del os.pidfd_open; " if request.param == "no pidfd" else ""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os; {hide}from trainlib._internal.rank import rank_main; "
            f"rank_main.main({theirs.fileno()})",
        ],
        pass_fds=(theirs.fileno(),),
        start_new_session=True,
    )
    theirs.close()
    yield ours, process.pid
    ours.close()  # the server exits when its worker's end closes
    assert process.wait(timeout=30) == 0


def _fork(connection: Connection) -> tuple[int, Connection]:
    connection.send(ForkRequest())
    reply = connection.recv()
    assert isinstance(reply, Forked)
    return reply.pid, Connection(recv_handle(connection))


def test_fork_server_forks_ranks_in_groups_of_their_own_and_reports_their_ends(
    server: tuple[Connection, int],
) -> None:
    connection, server_pid = server
    first, first_socket = _fork(connection)
    second, second_socket = _fork(connection)
    for pid in (first, second):
        rank = psutil.Process(pid)
        assert rank.ppid() == server_pid
        assert os.getpgid(pid) == pid  # leads its own group: killpg reaches all it starts
    first_socket.close()  # never launched: the rank exits as orphaned
    assert connection.recv() == RankExited(first, EXIT_ORPHANED)
    os.kill(second, signal.SIGKILL)
    assert connection.recv() == RankExited(second, -signal.SIGKILL)
    second_socket.close()
