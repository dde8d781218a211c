"""What a test starts decides its mark: a test not marked ``integration`` (``make test-fast``
runs only those) that starts a process, itself or through a fixture or the product, fails at
teardown naming what it started. Processes are what make a test slow and machine-dependent;
the mark comes from the file name (``*_integration.py``), a fixture in ``STARTS_SERVERS``, or
``pytest.mark.integration`` on the test or its module.

Counted: a Python interpreter started with ``subprocess`` (a server, a worker, a fresh process
that loads a model), a ``multiprocessing`` process and ``os.fork``. Other programs a library
runs briefly (``ldconfig``, ``uname``) are not. Nothing is changed: each is still started."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def _is_python(args: Any) -> bool:
    """Whether a Popen ``args`` (a list, or a command line) starts a Python interpreter."""
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")
    program = os.fsdecode(first)
    if isinstance(first, (str, bytes)):  # a command line: its first word
        program = next(iter(program.split()), "")
    return Path(program).name.startswith("python") or program == sys.executable


@contextmanager
def watching(started: list[str]) -> Iterator[None]:
    """Record in ``started`` each process started while the block runs."""
    popen_init: Callable[..., None] = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start
    fork = os.fork

    def recorded_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        if _is_python(args):
            shown = args if isinstance(args, str) else " ".join(map(os.fsdecode, args))
            started.append(f"subprocess {shown[:120]}")
        popen_init(self, args, *rest, **kwargs)

    def recorded_start(self: multiprocessing.process.BaseProcess) -> None:
        started.append(f"multiprocessing {self.name}")
        process_start(self)

    def recorded_fork() -> int:
        started.append("os.fork()")
        return fork()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", recorded_popen)
        patch.setattr(multiprocessing.process.BaseProcess, "start", recorded_start)
        patch.setattr(os, "fork", recorded_fork)
        yield
