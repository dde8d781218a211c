"""Warm rank processes: the next run on a warm cluster takes a started process, never one that
ran another rank; none outlives its cluster."""

from __future__ import annotations

import builtins
import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
from distributed import Client

import trainlib
from tests.helpers import rank_processes, trainlib_processes
from trainlib import RunConfig, ScalingConfig
from trainlib._internal.worker import rank_pool
from trainlib.torch import TorchTrainer


def record_process(config: dict[str, Any]) -> None:
    """Each rank writes its pid, its process's start time and what an earlier run left."""
    rank = trainlib.get_context().get_world_rank()
    left_over = getattr(builtins, "_trainlib_test_marker", None)
    builtins._trainlib_test_marker = config["run"]  # type: ignore[attr-defined]
    record = {"pid": os.getpid(), "born": psutil.Process().create_time(), "left": left_over}
    Path(config["out"], f"{config['run']}-{rank}.json").write_text(json.dumps(record))
    trainlib.report({"ok": 1})


def _fit(client: Client | None, out: Path, run: str) -> None:
    TorchTrainer(
        record_process,
        train_loop_config={"out": str(out), "run": run},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(out / "runs")),
        client=client,
    ).fit()


def test_pool_next_run_takes_a_started_process_never_a_used_one(
    dask_client: Client, tmp_path: Path
) -> None:
    _fit(dask_client, tmp_path, "first")
    second_started = time.time()
    _fit(dask_client, tmp_path, "second")
    first = [json.loads((tmp_path / f"first-{r}.json").read_text()) for r in range(2)]
    second = [json.loads((tmp_path / f"second-{r}.json").read_text()) for r in range(2)]
    assert {r["pid"] for r in first}.isdisjoint({r["pid"] for r in second})
    assert all(r["born"] < second_started for r in second)  # started before the run: warm
    assert [r["left"] for r in second] == [None, None]  # nothing of the first run's state


def test_pool_leaves_no_process_behind_its_own_cluster(tmp_path: Path) -> None:
    before = {p.pid for p in trainlib_processes()}  # other clusters' idle processes
    _fit(None, tmp_path, "own")  # fit() starts and closes a LocalCluster
    assert {p.pid for p in trainlib_processes()} <= before


def _idle_per_worker(client: Client) -> list[int]:
    """How many idle rank processes each worker of ``client`` holds now."""
    workers = client.run(os.getpid)
    idle = [p for p in trainlib_processes() if p not in rank_processes()]
    return sorted(sum(p.ppid() == pid for p in idle) for pid in workers.values())


def test_pool_keeps_as_many_idle_processes_as_a_search_asks_then_one(
    dask_client: Client, tmp_path: Path
) -> None:
    with rank_pool.idle_processes(dask_client, 2):
        assert _idle_per_worker(dask_client) == [2, 2]
        _fit(dask_client, tmp_path, "deep")  # each worker's rank takes one; one starts
        assert _idle_per_worker(dask_client) == [2, 2]
    assert _idle_per_worker(dask_client) == [1, 1]


def test_pool_keeps_one_idle_process_when_the_hosts_memory_is_short(
    dask_client: Client,
) -> None:
    # A million workers share this host: 10% of its memory buys none of them a spare process.
    dask_client.run(rank_pool.keep_idle, 4, 1_000_000)
    try:
        assert _idle_per_worker(dask_client) == [1, 1]
    finally:
        dask_client.run(rank_pool.keep_idle, 1)


PRIVATE = ("_TRAINLIB_TEST_GONE", "_TRAINLIB_TEST_NEW")


def record_private_state(config: dict[str, Any]) -> None:
    """Each rank writes its pid and the test's private variables as it sees them."""
    rank = trainlib.get_context().get_world_rank()
    seen = {"pid": os.getpid(), **{name: os.environ.get(name) for name in PRIVATE}}
    Path(config["out"], f"private-{rank}.json").write_text(json.dumps(seen))
    trainlib.report({"ok": 1})


def _set_variable(name: str, value: str | None) -> None:
    """Runs on a worker: set ``name`` in its environment, or remove it (None)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def test_pool_takes_an_idle_process_whose_private_variables_changed_since_it_started(
    dask_client: Client, tmp_path: Path
) -> None:
    """MLflow's telemetry sets and removes _MLFLOW_TELEMETRY_SESSION_ID in the driver (whose
    threads are a LocalCluster's workers) at any moment: a library's private variables changed
    after an idle process started must not waste it, and the rank sees them as they are now."""
    try:
        dask_client.run(_set_variable, "_TRAINLIB_TEST_GONE", "at start")
        dask_client.run(rank_pool.keep_idle, 0)
        dask_client.run(rank_pool.keep_idle, 1)  # started with _TRAINLIB_TEST_GONE set
        idle = {p.pid for p in trainlib_processes()} - {p.pid for p in rank_processes()}
        dask_client.run(_set_variable, "_TRAINLIB_TEST_GONE", None)
        dask_client.run(_set_variable, "_TRAINLIB_TEST_NEW", "now")
        TorchTrainer(
            record_private_state,
            train_loop_config={"out": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(tmp_path / "runs")),
            client=dask_client,
        ).fit()
    finally:
        for name in PRIVATE:
            dask_client.run(_set_variable, name, None)
    seen = [json.loads((tmp_path / f"private-{r}.json").read_text()) for r in range(2)]
    assert {s["pid"] for s in seen} <= idle  # both ranks took the idle processes
    assert [(s["_TRAINLIB_TEST_GONE"], s["_TRAINLIB_TEST_NEW"]) for s in seen] == [
        (None, "now"),
        (None, "now"),
    ]
