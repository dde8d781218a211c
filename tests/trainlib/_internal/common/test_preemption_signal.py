"""A SIGTERM that does not come with a SLURM preemption ends the process as before (the
preempted case runs on a real SLURM cluster: tests/trainlib/test_slurm_integration.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from trainlib._internal.common import preemption_signal

pytestmark = pytest.mark.integration  # starts processes (tests/process_guard.py)

# Installs the handler, then sends itself SIGTERM; prints "survived" if it lives on.
SCRIPT = """
import os, signal, sys, time
{before}
from trainlib._internal.common.preemption_signal import ignore_sigterm_while_preempting
ignore_sigterm_while_preempting()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)  # a pending handler runs at the next bytecode
print("survived", flush=True)
"""


def _run(before: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != preemption_signal.JOB_VARIABLE}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(before=before)],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_outside_a_slurm_job_nothing_changes() -> None:
    assert _run().returncode == -signal.SIGTERM


def test_a_sigterm_without_a_preemption_ends_the_process() -> None:
    """scontrol cannot name the job (no such job here): not a preemption, so the default."""
    done = _run(SLURM_JOB_ID="424242")
    assert done.returncode == -signal.SIGTERM and "survived" not in done.stdout


def test_a_handler_installed_before_still_gets_a_sigterm_without_a_preemption() -> None:
    before = (
        "signal.signal(signal.SIGTERM, lambda *a: (print('own handler', flush=True), sys.exit(3)))"
    )
    done = _run(before, SLURM_JOB_ID="424242")
    assert done.returncode == 3 and "own handler" in done.stdout
