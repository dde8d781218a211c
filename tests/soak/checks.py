"""What must hold after every night of the soak (each check returns what it found wrong)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType

import trainlib
from mlops.version_tags import PROMOTION_TAG, REQUEST_TAG, WITHDRAWN_TAG
from tests.helpers import rank_processes
from tests.soak.rig import MODEL, STORAGE, Rig


def alert_problems(runs: list[FlowRun], alerts: list[dict[str, Any]]) -> list[str]:
    """Every Failed or Crashed run gave exactly one alert; no Completed run gave one; no run
    ended Cancelled (nothing in the soak cancels one: a revoked concurrency lease would)."""
    problems = []
    for run in runs:
        if run.state is not None and run.state.type == StateType.CANCELLED:
            problems.append(f"{run.name} ended Cancelled")
        about = [a for a in alerts if f"run {run.name} " in a["subject"]]
        failed = run.state is not None and run.state.type in (StateType.FAILED, StateType.CRASHED)
        if failed and len(about) != 1:
            problems.append(f"{run.name} ended {run.state.name} with {len(about)} alerts")
        if not failed and about:
            problems.append(f"{run.name} ended {run.state.name if run.state else None} alerted")
    return problems


def incident_problems(alerts: list[dict[str, Any]]) -> list[str]:
    """The sentinel's alerts of one night (those about no run): one per incident, so no
    subject twice."""
    sent = Counter(a["subject"] for a in alerts if "run " not in a["subject"])
    return [f"sentinel alert {s!r} sent {n} times" for s, n in sorted(sent.items()) if n > 1]


def zombie_problems(rig: Rig) -> list[str]:
    """No run left Running, Pending or Late; no concurrency slot held, Prefect's or Dask's."""
    problems = []
    with get_client(sync_client=True) as client:
        stuck = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
                )
            )
        )
        late = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            )
        )
        problems += [f"{r.name} left {r.state.name}" for r in stuck if r.state]
        problems += [
            f"{r.name} left {r.state.name}" for r in late if r.state and r.state.name == "Late"
        ]
        nightly = client.read_deployment_by_name("train-cifar/nightly")
        if nightly.global_concurrency_limit and nightly.global_concurrency_limit.active_slots:
            problems.append("train-cifar/nightly's concurrency slot is held")
    leases = _dask_leases(rig)
    if leases:
        problems.append(f"the cluster's training slot is held ({leases} leases)")
    return problems


def _dask_leases(rig: Rig) -> int:
    from distributed import Client

    def held(dask_scheduler: Any) -> int:
        extension = dask_scheduler.extensions.get("semaphores")
        return len(extension.leases.get("cifar-training", {})) if extension else 0

    with Client(rig.dask.address, timeout=30) as client:
        return int(client.run_on_scheduler(held))


def registry_problems(rig: Rig, swept: bool) -> list[str]:
    """After a publish (``swept``: it withdraws what killed publishes left), every version has an
    alias, a decision or ``withdrawn``; always, one usable version per flow run and a
    ``@champion`` with every gate passed and a card."""
    client = MlflowClient(rig.mlflow.url)
    problems = []
    usable: dict[str, list[str]] = defaultdict(list)
    try:
        versions = client.search_model_versions(f"name='{MODEL}'")
    except Exception as error:
        return [f"the registry cannot be read: {error}"]
    champion = _champion(client)
    for version in versions:
        tags = dict(version.tags or {})
        if WITHDRAWN_TAG in tags:
            continue
        usable[tags.get(REQUEST_TAG, "?")].append(str(version.version))
        has_alias = str(version.version) == (champion.version if champion else None)
        if swept and PROMOTION_TAG not in tags and not has_alias:
            aliases = client.get_model_version(MODEL, version.version).aliases
            if not aliases:
                problems.append(f"version {version.version}: no alias, decision or withdrawal")
    problems += [f"flow run {r} has usable versions {v}" for r, v in usable.items() if len(v) > 1]
    if champion is not None:
        if WITHDRAWN_TAG in champion.tags:
            problems.append(f"@champion (v{champion.version}) is withdrawn")
        gates = {k: v for k, v in champion.tags.items() if k.startswith("gate/")}
        if not gates or any(not v.startswith("passed") for v in gates.values()):
            problems.append(f"@champion (v{champion.version}) gates: {gates}")
        if not champion.description:
            problems.append(f"@champion (v{champion.version}) has no model card")
    return problems


def _champion(client: MlflowClient) -> Any:
    try:
        return client.get_model_version_by_alias(MODEL, "champion")
    except Exception:
        return None


LOAD = """
import sys, numpy as np, mlflow.pyfunc
model = mlflow.pyfunc.load_model(f"models:/{sys.argv[1]}@champion")
scores = model.predict(np.zeros((2, 3, 32, 32), dtype=np.uint8))
assert np.asarray(scores).shape == (2, 10)
"""


def champion_loads(rig: Rig) -> list[str]:
    """``@champion`` loads in a new process and scores two images."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD, MODEL],
        env={**rig.env, "MLFLOW_TRACKING_URI": rig.mlflow.url},
        capture_output=True,
        text=True,
        timeout=180,
    )
    return [] if done.returncode == 0 else [f"@champion does not load: {done.stderr[-500:]}"]


def leftover_problems(rig: Rig, swept: bool) -> list[str]:
    """No rank process left; after a publish (``swept``), no uncommitted checkpoint in storage."""
    problems = [f"rank process {p.pid} left" for p in rank_processes()]
    if swept:
        fs = rig.s3_filesystem()
        fs.invalidate_cache()
        runs = f"{STORAGE.removeprefix('s3://')}/runs"
        for run in fs.ls(runs) if fs.exists(runs) else []:
            committed = {
                c.path.rstrip("/") for c, _ in trainlib.Result.from_path(run, fs).best_checkpoints
            }
            fs.invalidate_cache(run)
            for directory in fs.ls(run, detail=False):
                # (SeaweedFS lists a folder whose files were all deleted: an empty one is none)
                inside = [f for f in fs.find(directory) if f.rstrip("/") != directory.rstrip("/")]
                if directory.rstrip("/") not in committed and inside:
                    problems.append(f"uncommitted checkpoint left: {directory}")
    return problems


def storage_use(rig: Rig) -> tuple[float, float]:
    """(S3 bytes used, PostgreSQL bytes used) in MB."""
    fs = rig.s3_filesystem()
    fs.invalidate_cache()
    s3 = sum(fs.du(bucket) for bucket in ("cifar", "mlflow")) / 1e6
    database = float(
        rig.postgres.sql("SELECT sum(pg_database_size(datname)) FROM pg_database").strip()
    )
    return s3, database / 1e6


def _training_clients(dask_scheduler: Any) -> list[str]:
    """The Dask clients (one per training's driver) whose rank tasks are running."""
    return sorted(
        {
            client.client_key
            for key, task in dask_scheduler.tasks.items()
            if str(key).startswith("trainlib-rank-") and task.state == "processing"
            for client in task.who_wants
        }
    )


@dataclass
class OverlapWatch:
    """Samples the Dask scheduler twice a second: rank tasks of two trainings (two drivers'
    clients; a restarted group keeps its driver's) running at once is an overlap."""

    address: str
    overlaps: list[str] = field(default_factory=list)
    trainings: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread = field(init=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, daemon=True, name="overlap-watch")
        self._thread.start()

    def stop(self) -> None:
        """Stop watching, its client closed (before the cluster goes)."""
        self._stop.set()
        self._thread.join(timeout=60)

    def _watch(self) -> None:
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            while not self._stop.wait(0.5):
                try:
                    drivers = client.run_on_scheduler(_training_clients)
                except Exception:
                    continue
                self.trainings |= set(drivers)
                if len(drivers) > 1:
                    self.overlaps.append(f"{time.strftime('%H:%M:%S')}: {drivers}")
