"""The soak's services, the test rig's real ones, each of which a fault can stop, kill or cut:
PostgreSQL (Prefect's and MLflow's databases), SeaweedFS (S3: the data, the runs' storage,
MLflow's artifacts), an MLflow server behind a proxy that can lose a registry reply, the
Prefect server with its process worker, a Dask scheduler with two workers (nanny-supervised
processes, as the stack's), the sentinel, and a webhook receiving every alert.

The worker's environment is the stack's (docker/docker-compose.yml), with shorter bounds where
the soak compresses time (``Bounds``); what the soak shortened is printed with its table.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import psutil

from cifar.format import write_synthetic_archive
from tests.helpers import SESSION_VARIABLE, free_port, http_server
from tests.lossy_proxy import LossyProxy, lossy_proxy
from tests.mlflow_rig import MlflowServer
from tests.postgres_rig import Postgres, postgres_server
from tests.prefect_stack import (
    REPO,
    PrefectServer,
    create_pool,
    deploy_all,
    prefect_environment,
    start_worker,
)
from tests.s3_rig import KEY, SECRET, SeaweedServer, filesystem

DATA_BUCKET, MLFLOW_BUCKET = "cifar", "mlflow"
STORAGE = f"s3://{DATA_BUCKET}/data"
ARCHIVE_KEY = f"{DATA_BUCKET}/archive/cifar-10-python.tar.gz"
MODEL = "soak-classifier"
DISK_SIZE = "size=1g"  # S3's disk, when the soak may fill it


@dataclass(frozen=True)
class Bounds:
    """The stack's time bounds, as the soak shortens them (the stack's in comments)."""

    heartbeat_s: int = 30  # 30: Prefect's least
    zombie_s: float = 75.0  # 90: no heartbeat this long while the server is up -> Crashed
    pending_s: float = 120.0  # 600
    down_s: float = 45.0  # 300: the Prefect server or a service unhealthy this long -> alert
    late_s: int = 60  # 900: a Late run not started this long -> alert
    outage_tolerance_s: float = 300.0  # 900: what a run rides through
    night_s: float = 900.0  # how long a night may take before it counts as lost

    def shortened(self) -> str:
        return (
            f"heartbeats every {self.heartbeat_s} s (30), Crashed after {self.zombie_s:g} s "
            f"silent (90), Pending {self.pending_s:g} s (600), down alerts after "
            f"{self.down_s:g} s (300), Late alerts after {self.late_s} s (900), outage "
            f"tolerance {self.outage_tolerance_s:g} s (900)"
        )


@dataclass
class Webhook:
    """Every alert posted, in order, with when it arrived."""

    url: str
    received: queue.Queue[tuple[float, dict[str, Any]]] = field(default_factory=queue.Queue)
    seen: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def drain(self) -> list[tuple[float, dict[str, Any]]]:
        """The alerts received since the last drain (also kept in ``seen``)."""
        new = []
        while True:
            try:
                new.append(self.received.get_nowait())
            except queue.Empty:
                break
        self.seen += new
        return new


class DaskCluster:
    """``dask scheduler`` and nanny-supervised ``dask worker`` processes, one thread each."""

    def __init__(self, root: Path, env: dict[str, str], workers: int = 2) -> None:
        self.root, self.env = root, env
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.nannies: list[subprocess.Popen[bytes]] = []
        self._workers = workers

    def start(self) -> None:
        port = self.address.rsplit(":", 1)[1]
        self.scheduler = self._spawn(
            ["scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard"], "scheduler"
        )
        for i in range(self._workers):
            self.nannies.append(
                self._spawn(
                    [
                        *("worker", self.address, "--name", f"w{i + 1}", "--nthreads", "1"),
                        *("--memory-limit", "4GB", "--no-dashboard", "--host", "127.0.0.1"),
                    ],
                    f"worker-{i + 1}",
                )
            )
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(self._workers, timeout=120)

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.root / f"dask-{name}.log", "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_" + args[0], *args[1:]],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def worker_processes(self) -> list[psutil.Process]:
        """The worker process under each nanny (what a crash kills; the nanny restarts it)."""
        return [
            child
            for nanny in self.nannies
            for child in psutil.Process(nanny.pid).children()
            if "spawn_main" in " ".join(child.cmdline())  # (not the resource tracker)
        ]

    def host_tree(self, index: int) -> list[psutil.Process]:
        """Every process of worker ``index``'s "host": its nanny and all it started."""
        nanny = psutil.Process(self.nannies[index].pid)
        return [nanny, *nanny.children(recursive=True)]

    def stop(self) -> None:
        for process in [*self.nannies, *([self.scheduler] if self.scheduler else [])]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@dataclass
class Rig:
    """The running services and how to reach them."""

    root: Path
    bounds: Bounds
    postgres: Postgres
    s3: SeaweedServer
    mlflow: MlflowServer
    mlflow_url: str  # through the proxy: what the runs use
    proxy: LossyProxy
    prefect: PrefectServer
    env: dict[str, str]  # the Prefect worker's (and the soak's clients') environment
    dask: DaskCluster
    webhook: Webhook
    archive: dict[str, str]  # data_url, data_md5
    worker: subprocess.Popen[bytes] | None = None
    sentinel: subprocess.Popen[bytes] | None = None
    restarts: dict[str, int] = field(default_factory=dict)

    def start_worker(self) -> None:
        """The Prefect worker, in a session of its own (a fault kills it with its flow runs)."""
        self.worker = start_worker(self.env, "soak", self.root / "prefect-worker.log")

    def kill_worker_tree(self) -> int:
        """SIGKILL the worker and every process it started, at once; how many were killed."""
        assert self.worker is not None
        tree = psutil.Process(self.worker.pid)
        processes = [tree, *tree.children(recursive=True)]
        for process in processes:
            with suppress(psutil.NoSuchProcess):
                process.kill()
        self.worker.wait()
        psutil.wait_procs(processes, timeout=30)
        return len(processes)

    def s3_filesystem(self) -> Any:
        return filesystem(self.s3.endpoint)


def _webhook() -> tuple[type[BaseHTTPRequestHandler], Webhook]:
    """A webhook's request handler and what it receives (its URL set once it is served)."""
    hook = Webhook("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            hook.received.put((time.time(), json.loads(self.rfile.read(length) or b"{}")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler, hook


def _s3_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
    }


@contextmanager
def soak_rig(root: Path, bounds: Bounds, small_disk: bool = False) -> Iterator[Rig]:
    """Every service started, the deployments, automations and training slots in place.
    ``small_disk``: S3 keeps its data on a tmpfs of its own (root only), which a fault fills."""
    with ExitStack() as stack:
        postgres = stack.enter_context(postgres_server())
        prefect_db = postgres.create_database("prefect")
        mlflow_db = postgres.create_database("mlflow")
        (root / "s3" / "data").mkdir(parents=True, exist_ok=True)
        if small_disk:
            data = str(root / "s3" / "data")
            subprocess.run(["mount", "-t", "tmpfs", "-o", DISK_SIZE, "tmpfs", data], check=True)
            stack.callback(subprocess.run, ["umount", "-l", data], check=False)
        s3 = SeaweedServer(root / "s3", buckets=(DATA_BUCKET, MLFLOW_BUCKET))
        s3.start()
        stack.callback(s3.stop)
        archive = _upload_archive(root, s3)
        (root / "mlflow").mkdir(exist_ok=True)
        mlflow = MlflowServer(
            root / "mlflow",
            *("--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts"),
            backend=mlflow_db,
            env={**_s3_env(s3.endpoint), "MLFLOW_S3_ENDPOINT_URL": s3.endpoint},
        )
        mlflow.start()
        stack.callback(mlflow.stop)
        mlflow_url, proxy = stack.enter_context(
            lossy_proxy(mlflow.url, "/model-versions/create", times=0)
        )
        (root / "prefect").mkdir(exist_ok=True)
        env = prefect_environment(root / "prefect", prefect_db)
        env.update(
            {
                # Prefect's own vacuum of old flow runs, logs and artifacts (the stack's)
                "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "events,flow_runs",
                "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD": "P90D",
                **_s3_env(s3.endpoint),
                "CIFAR_STORAGE_PATH": STORAGE,
                "MLFLOW_TRACKING_URI": mlflow_url,
                "CIFAR_OUTAGE_TOLERANCE_S": str(bounds.outage_tolerance_s),
                "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(bounds.heartbeat_s),
                "PREFECT_CLIENT_MAX_RETRIES": "10",
                "PREFECT_CLIENT_RETRY_EXTRA_CODES": "500",  # as the stack's worker
                SESSION_VARIABLE: os.environ.get(SESSION_VARIABLE, "soak"),
            }
        )
        prefect = PrefectServer(env, root / "prefect" / "server.log")
        prefect.start()
        stack.callback(prefect.stop)
        dask = DaskCluster(root, env)
        stack.callback(dask.stop)
        dask.start()
        env["DASK_SCHEDULER_ADDRESS"] = dask.address
        create_pool(env)
        deploy_all(env)
        _without_schedules(env)
        handler, webhook = _webhook()
        webhook.url = f"{stack.enter_context(http_server(handler))}/hook"
        _run(
            env,
            *("-m", "deployments.alerts", "--url", webhook.url),
            *("--within", f"cifar-run-late={bounds.late_s}"),
        )
        rig = Rig(
            root,
            bounds,
            postgres,
            s3,
            mlflow,
            mlflow_url,
            proxy,
            prefect,
            env,
            dask,
            webhook,
            archive,
        )
        rig.start_worker()
        stack.callback(_stop_worker, rig)
        rig.sentinel = _start_sentinel(rig)
        stack.callback(_terminate, rig.sentinel)
        yield rig


def _upload_archive(root: Path, s3: SeaweedServer) -> dict[str, str]:
    local = root / "cifar-10-python.tar.gz"
    md5 = write_synthetic_archive(str(local), images_per_batch=400)
    filesystem(s3.endpoint).put(str(local), ARCHIVE_KEY)
    return {"data_url": f"s3://{ARCHIVE_KEY}", "data_md5": md5}


def _start_sentinel(rig: Rig) -> subprocess.Popen[bytes]:
    b = rig.bounds
    with open(rig.root / "sentinel.log", "ab") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "deployments.sentinel", "--url", rig.webhook.url),
                *("--interval-s", "2", "--zombie-s", str(b.zombie_s)),
                *("--pending-s", str(b.pending_s), "--down-s", str(b.down_s)),
                *("--state", str(rig.root / "sentinel-state.json")),
                *("--check", f"mlflow={rig.mlflow.url}/health"),
                *("--check", f"s3={rig.s3.endpoint}/healthz"),
            ],
            env=rig.env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop_worker(rig: Rig) -> None:
    if rig.worker is not None and rig.worker.poll() is None:
        rig.kill_worker_tree()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)


def _without_schedules(env: dict[str, str]) -> None:
    """The deployments' crons switched off (their runs not yet started deleted): the soak makes
    its own nights. A soak that ran across 03:00 UTC got the real nightly too, queued behind the
    soak's and left running at the night's checks (seen once in CI's soak)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}),
        get_client(sync_client=True) as client,
    ):
        for deployment in client.read_deployments():
            for schedule in deployment.schedules:
                client.update_deployment_schedule(deployment.id, schedule.id, active=False)


def _run(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def clean_root(root: Path) -> Path:
    """``root``, new and empty (a disk an earlier soak left mounted there unmounted)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        mount_point = line.split()[1]
        if mount_point.startswith(f"{root.resolve()}/"):
            subprocess.run(["umount", "-l", mount_point], check=False)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root
