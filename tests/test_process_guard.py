"""The guard that gives a test its mark (``tests/process_guard.py``) sees each kind of process a
test may start, and nothing else. (It starts processes itself: an integration test.)"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.process_guard import watching

pytestmark = pytest.mark.integration


def test_the_guard_sees_a_python_subprocess_a_multiprocessing_process_and_a_fork() -> None:
    started: list[str] = []
    with watching(started):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        context = multiprocessing.get_context("spawn")
        process = context.Process(target=int, name="guarded")
        process.start()
        process.join()
        if (pid := os.fork()) == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    assert [s.split()[0] for s in started] == ["subprocess", "multiprocessing", "os.fork()"]
    assert "guarded" in started[1]


def test_the_guard_leaves_other_programs_and_restores_what_it_watched() -> None:
    started: list[str] = []
    popen_init = subprocess.Popen.__init__
    with watching(started):
        subprocess.run(["true"], check=True)
        subprocess.run("true", shell=True, check=True)
    assert started == []
    assert subprocess.Popen.__init__ is popen_init
