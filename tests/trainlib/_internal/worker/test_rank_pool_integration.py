"""Warm rank processes: each worker forks its ranks from one fork server with torch imported;
a run never gets a process that ran another rank, and none outlives its cluster."""

from __future__ import annotations

import builtins
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from distributed import Client

import trainlib
from tests.helpers import rank_processes, trainlib_processes
from trainlib import RunConfig, ScalingConfig
from trainlib._internal.worker import rank_pool
from trainlib.torch import TorchTrainer


def record_process(config: dict[str, Any]) -> None:
    """Each rank writes its pid, its parent, what an earlier run left and a random draw."""
    rank = trainlib.get_context().get_world_rank()
    left_over = getattr(builtins, "_trainlib_test_marker", None)
    builtins._trainlib_test_marker = config["run"]  # type: ignore[attr-defined]
    record = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "left": left_over,
        "numpy": int(np.random.randint(2**31)),
    }
    Path(config["out"], f"{config['run']}-{rank}.json").write_text(json.dumps(record))
    trainlib.report({"ok": 1})


def _fit(client: Client | None, out: Path, run: str) -> list[dict[str, Any]]:
    TorchTrainer(
        record_process,
        train_loop_config={"out": str(out), "run": run},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(out / "runs")),
        client=client,
    ).fit()
    return [json.loads((out / f"{run}-{r}.json").read_text()) for r in range(2)]


def _run(client: Client, train_func: Any, out: Path) -> trainlib.Result:
    """A 2-rank run of ``train_func`` on ``client``, given ``{"out": out}``."""
    return TorchTrainer(
        train_func,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(out / "runs")),
        client=client,
    ).fit()


def _servers(client: Client) -> dict[str, list[psutil.Process]]:
    """Each worker's fork servers now, by worker address."""
    workers = client.run(os.getpid)
    servers = [p for p in trainlib_processes() if p not in rank_processes()]
    return {address: [p for p in servers if p.ppid() == pid] for address, pid in workers.items()}


def test_pool_forks_each_run_fresh_processes_from_one_server_per_worker(
    dask_client: Client, tmp_path: Path
) -> None:
    first = _fit(dask_client, tmp_path, "first")
    servers = _servers(dask_client)
    second_started = time.time()
    second = _fit(dask_client, tmp_path, "second")
    assert {r["pid"] for r in first}.isdisjoint({r["pid"] for r in second})
    assert [r["left"] for r in second] == [None, None]  # nothing of the first run's state
    # every rank was forked by its worker's server, started before the second run (warm)
    server_pids = {p.pid for found in servers.values() for p in found}
    assert [len(found) for found in servers.values()] == [1, 1]
    assert {r["parent"] for r in first + second} == server_pids
    assert all(p.create_time() < second_started for found in servers.values() for p in found)
    assert _servers(dask_client) == servers  # still the same, one per worker
    # each forked process draws its own numpy random numbers, as a new process would
    assert len({r["numpy"] for r in first + second}) == 4


def test_pool_leaves_no_process_behind_its_own_cluster(tmp_path: Path) -> None:
    before = {p.pid for p in trainlib_processes()}  # other clusters' fork servers
    _fit(None, tmp_path, "own")  # fit() starts and closes a LocalCluster
    assert {p.pid for p in trainlib_processes()} <= before


def test_pool_replaces_a_fork_server_that_was_killed(dask_client: Client, tmp_path: Path) -> None:
    _fit(dask_client, tmp_path, "before")
    killed = [p for found in _servers(dask_client).values() for p in found]
    for server in killed:
        server.send_signal(signal.SIGKILL)  # dead or dying as the next run asks it to fork
    records = _fit(dask_client, tmp_path, "after")
    servers = _servers(dask_client)
    assert [len(found) for found in servers.values()] == [1, 1]
    assert {r["parent"] for r in records} == {p.pid for f in servers.values() for p in f}
    assert {r["parent"] for r in records}.isdisjoint({p.pid for p in killed})


def kill_own_server_then_report(config: dict[str, Any]) -> None:
    """Each rank kills the fork server it came from, then trains on and reports."""
    os.kill(os.getppid(), signal.SIGKILL)
    trainlib.report({"ok": 1})


def test_pool_a_run_whose_fork_server_dies_under_it_completes(
    dask_client: Client, tmp_path: Path
) -> None:
    result = TorchTrainer(
        kill_own_server_then_report,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert result.error is None
    assert result.metrics == {"ok": 1}
    records = _fit(dask_client, tmp_path, "next")  # and the next run gets new servers
    servers = _servers(dask_client)
    assert {r["parent"] for r in records} == {p.pid for f in servers.values() for p in f}


PRIVATE = ("_TRAINLIB_TEST_GONE", "_TRAINLIB_TEST_NEW")


def record_private_state(config: dict[str, Any]) -> None:
    """Each rank writes its pid and the test's private variables as it sees them."""
    rank = trainlib.get_context().get_world_rank()
    seen = {"parent": os.getppid(), **{name: os.environ.get(name) for name in PRIVATE}}
    Path(config["out"], f"private-{rank}.json").write_text(json.dumps(seen))
    trainlib.report({"ok": 1})


def _set_variable(name: str, value: str | None) -> None:
    """Runs on a worker: set ``name`` in its environment, or remove it (None)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _restart_fork_server(dask_worker: Any) -> None:
    """Runs on a worker: stop its fork server and start a new one now."""
    rank_pool.close(dask_worker.address)
    rank_pool.RankPoolPlugin().setup(dask_worker)


def test_pool_uses_a_server_whose_private_variables_changed_since_it_started(
    dask_client: Client, tmp_path: Path
) -> None:
    """MLflow's telemetry sets and removes _MLFLOW_TELEMETRY_SESSION_ID in the driver (whose
    threads are a LocalCluster's workers) at any moment: a library's private variables changed
    after a fork server started must not waste it, and the rank sees them as they are now."""
    try:
        dask_client.run(_set_variable, "_TRAINLIB_TEST_GONE", "at start")
        dask_client.run(_restart_fork_server)  # started with _TRAINLIB_TEST_GONE set
        servers = {p.pid for found in _servers(dask_client).values() for p in found}
        dask_client.run(_set_variable, "_TRAINLIB_TEST_GONE", None)
        dask_client.run(_set_variable, "_TRAINLIB_TEST_NEW", "now")
        _run(dask_client, record_private_state, tmp_path)
    finally:
        for name in PRIVATE:
            dask_client.run(_set_variable, name, None)
    seen = [json.loads((tmp_path / f"private-{r}.json").read_text()) for r in range(2)]
    assert {s["parent"] for s in seen} == servers  # forked by the servers started before
    assert [(s["_TRAINLIB_TEST_GONE"], s["_TRAINLIB_TEST_NEW"]) for s in seen] == [
        (None, "now"),
        (None, "now"),
    ]


def record_threads(config: dict[str, Any]) -> None:
    rank = trainlib.get_context().get_world_rank()
    Path(config["out"], f"threads-{rank}.json").write_text(json.dumps(torch.get_num_threads()))
    trainlib.report({"ok": 1})


def test_pool_forked_ranks_use_the_workers_omp_num_threads(
    dask_client: Client, tmp_path: Path
) -> None:
    """torch read OMP_NUM_THREADS in the fork server, and a fork resets its thread pool: the
    rank applies the variable as a new process would."""
    try:
        dask_client.run(_set_variable, "OMP_NUM_THREADS", "3")  # the servers start anew
        _run(dask_client, record_threads, tmp_path)
    finally:
        dask_client.run(_set_variable, "OMP_NUM_THREADS", None)
    assert [json.loads((tmp_path / f"threads-{r}.json").read_text()) for r in range(2)] == [3, 3]
