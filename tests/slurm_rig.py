"""A real SLURM cluster on this machine for tests: munged, slurmctld and one slurmd.

Jobs go to the ``debug`` partition by default; a job sent to ``urgent`` preempts them where it
needs their cores (``PreemptMode=CANCEL``: SIGTERM to every process of the job, SIGKILL
``KillWait`` (5 s) later).

Everything lives under one folder (configuration, state, logs, the munge socket and key), on
ports chosen at run time; clients find it through ``SLURM_CONF``. The daemons run in the
foreground as our own child processes, so stopping them leaves nothing behind. Needs root and
Debian's ``slurm-wlm`` and ``munge`` (``apt-get install -y slurm-wlm munge``; ``make test``
installs them as root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.helpers import free_port

STARTUP_S = 30.0
STOP_S = 20.0
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
INSTALL_HINT = "apt-get install -y slurm-wlm munge"

CONF = """\
ClusterName=trainlibtest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/run/munge.socket.2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={node} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""


@dataclass(frozen=True)
class SlurmCluster:
    """A running test cluster: its folder, node and the environment its clients need."""

    root: Path
    node: str
    cpus: int
    memory_mb: int

    @property
    def env(self) -> dict[str, str]:
        """What ``sbatch``/``squeue`` (and dask-jobqueue, which calls them) need."""
        return {"SLURM_CONF": str(self.root / "etc" / "slurm.conf")}

    def command(self, *argv: str, timeout_s: float = 30.0) -> str:
        """Run a SLURM client command against this cluster; its stdout."""
        done = subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def jobs(self) -> list[tuple[str, str, str]]:
        """``(job id, state, reason)`` of every job the controller knows and has not ended."""
        out = self.command("squeue", "--noheader", "--format=%i|%T|%r")
        return [tuple(line.split("|", 2)) for line in out.splitlines() if line]  # type: ignore[misc]

    def job_processes(self) -> list[psutil.Process]:
        """Live processes of this cluster's jobs (Dask workers, ranks...), found by the
        ``SLURM_JOB_ID`` and ``SLURM_CONF`` in their environment."""
        conf = self.env["SLURM_CONF"]
        found = []
        for process in psutil.process_iter():
            try:
                environ = process.environ()
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if environ.get("SLURM_CONF") == conf and "SLURM_JOB_ID" in environ:
                found.append(process)
        return found

    def wait_until_drained(self, timeout_s: float = STOP_S) -> None:
        """Wait until no job is queued or running and no job process is alive, or raise."""
        deadline = time.monotonic() + timeout_s
        while self.jobs() or self.job_processes():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {timeout_s} s, jobs {self.jobs()} and processes "
                    f"{[p.cmdline() for p in self.job_processes()]} are left"
                )
            time.sleep(0.1)

    def log(self, name: str) -> str:
        """The tail of a daemon's log (``slurmctld``, ``slurmd``), for failure messages."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def missing_tools() -> list[str]:
    """SLURM and munge programs not installed here."""
    return [name for name in DAEMONS if shutil.which(name) is None]


def unavailable_reason() -> str | None:
    """Why the test cluster cannot start on this machine, or None when it can."""
    missing = missing_tools()
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing); as root on Debian/Ubuntu: "
            f"{INSTALL_HINT}"
        )
    if os.geteuid() != 0:
        return "the test SLURM cluster runs slurmctld and slurmd as root (SlurmUser=root)"
    return None


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait(ready: object, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while not ready():  # type: ignore[operator]
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {STARTUP_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@contextmanager
def slurm_cluster(root: Path, cpus: int = 2, memory_mb: int = 8000) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under ``root``; on exit cancel every job and stop
    them. The node advertises ``cpus`` cores and ``memory_mb`` (not enforced: no cgroups)."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(
            f"SLURM is not installed here (missing: {', '.join(missing)}); "
            f"install it with `{INSTALL_HINT}` (as root)."
        )
    for sub in ("etc", "state", "spool", "run", "log", "munge/etc", "munge/lib", "munge/log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        if sub.startswith("munge/"):
            (root / sub).chmod(0o700)
    (root / "munge/run").mkdir(mode=0o755, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    cluster = SlurmCluster(root, node, cpus, memory_mb)
    conf = root / "etc" / "slurm.conf"
    conf.write_text(
        CONF.format(
            root=root,
            node=node,
            ctld_port=free_port(),
            slurmd_port=free_port(),
            cpus=cpus,
            memory_mb=memory_mb,
        )
    )
    key = root / "munge/etc/munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    daemon_env = {**os.environ, **cluster.env}
    with ExitStack() as stack:
        socket_path = root / "munge/run/munge.socket.2"
        munge_log = root / "munge/log/munged.out"
        munged = _start(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={socket_path}",
                f"--pid-file={root}/munge/run/munged.pid",
                f"--log-file={root}/munge/log/munged.log",
                f"--seed-file={root}/munge/lib/munged.seed",
            ],
            munge_log,
        )
        stack.callback(_stop, munged)
        _wait(socket_path.exists, munged, "munged", munge_log)
        processes = []
        for argv in (["slurmctld", "-D", "-c", "-i"], ["slurmd", "-D", "-c"]):
            log = root / "log" / f"{argv[0]}.out"
            with open(log, "ab") as out:
                process = subprocess.Popen(
                    argv, env=daemon_env, stdout=out, stderr=subprocess.STDOUT
                )
            processes.append((process, argv[0], log))
            stack.callback(_stop, process)
        for process, name, log in processes:
            _wait(lambda: True, process, name, log)
        ctld, _, ctld_log = processes[0]

        def idle() -> bool:
            try:
                state = cluster.command("sinfo", "--noheader", "--format=%T", timeout_s=5)
            except (RuntimeError, subprocess.TimeoutExpired):
                return False
            return state.strip() == "idle"

        _wait(idle, ctld, "slurmctld/slurmd (node idle)", ctld_log)
        stack.callback(_cancel_all, cluster)  # runs before the daemons stop
        yield cluster


def _cancel_all(cluster: SlurmCluster) -> None:
    """Cancel every job and wait until the controller has none left."""
    cluster.command("scancel", "--user", "root")
    deadline = time.monotonic() + STOP_S
    while cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
