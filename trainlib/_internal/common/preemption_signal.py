"""SLURM's preemption signal, told apart from every other SIGTERM.

When SLURM preempts a job (``PreemptMode=CANCEL`` or ``REQUEUE``) it sends SIGCONT and SIGTERM
to every process of the job, and SIGKILL ``KillWait`` seconds later; ``scancel`` and the
walltime send the same SIGTERM. Only the job's record tells them apart: ``scontrol show job``
gives a ``PreemptTime`` once SLURM has chosen the job for preemption (``None`` before, and for
a cancelled job). Inside a preempted job, trainlib's processes of the Dask worker's job (the
worker, its fork server, the ranks) ignore the SIGTERM, and the worker's nanny, which the
``dask worker`` command closes on it, first retires its worker gracefully
(``worker.preemption_retirement``): the driver sees a preemption, as with ``retire_workers``.
Every other SIGTERM ends them as before. (A job of a partition that preempts by suspending,
``PreemptMode=SUSPEND``, keeps its ``PreemptTime`` once resumed: there a later SIGTERM would be
taken for a preemption too.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from types import FrameType

JOB_VARIABLE = "SLURM_JOB_ID"
_PREEMPT_TIME = re.compile(r"\bPreemptTime=(\S+)")
_SCONTROL_TIMEOUT_S = 5.0  # well within SLURM's KillWait (30 s by default)
_preempted = False  # once SLURM preempts a job it does not take it back
_HANDLER_NAME = "trainlib_preemption_sigterm"


def in_slurm_job() -> bool:
    """Whether this process runs inside a SLURM job."""
    return bool(os.environ.get(JOB_VARIABLE))


def preempting() -> bool:
    """Whether SLURM is preempting this process's job (False outside a job, or when
    ``scontrol`` cannot say within 5 s)."""
    global _preempted
    job = os.environ.get(JOB_VARIABLE)
    if not job:
        return False
    if _preempted:
        return True
    try:
        shown = subprocess.run(
            ["scontrol", "--oneliner", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=_SCONTROL_TIMEOUT_S,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    found = _PREEMPT_TIME.search(shown)
    _preempted = found is not None and found.group(1) not in ("None", "Unknown")
    return _preempted


def ignore_sigterm_while_preempting() -> None:
    """In a SLURM job (and the main thread): a SIGTERM that comes with the job's preemption is
    ignored (the worker retires, then its processes are stopped as after any retirement); any
    other goes to the Python handler there was before this call, or, where there was none (the
    default, or a handler set outside Python), ends the process. Installed once a process."""
    if not in_slurm_job() or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "__name__", None) == _HANDLER_NAME:
        return  # a plugin set up again (the worker re-registered): one handler is enough

    def trainlib_preemption_sigterm(signum: int, frame: FrameType | None) -> None:
        if preempting():
            return
        signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGTERM)  # the default action: end

    signal.signal(signal.SIGTERM, trainlib_preemption_sigterm)
