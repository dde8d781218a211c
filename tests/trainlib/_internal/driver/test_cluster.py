"""Connecting to a Dask cluster (or starting one) and picking the workers that host ranks."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest
from distributed import Client, Worker

from tests.helpers import local_cluster, mixed_cluster
from trainlib import ConfigError, DaskConfig, NotEnoughWorkersError, ScalingConfig
from trainlib._internal.common import gpu_discovery
from trainlib._internal.driver.cluster import connect
from trainlib._internal.driver.worker_selection import select_workers, worker_statuses


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A running 2-worker cluster (threads of this process), as a user's cluster would be."""
    with local_cluster(2, processes=False) as client:
        yield client


def _address(client: Client) -> str:
    assert client.scheduler is not None
    return str(client.scheduler.address)


def _workers(client: Client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


def test_cluster_connect_uses_the_given_client_as_it_is(client: Client) -> None:
    with connect(DaskConfig(), num_workers=5, client=client) as given:
        assert given is client
    assert client.status == "running"


def test_cluster_connect_to_address_leaves_the_cluster_running(client: Client) -> None:
    with connect(DaskConfig(address=_address(client)), num_workers=5) as remote:
        assert remote is not client
        assert _address(remote) == _address(client)
        assert sorted(worker_statuses(remote)) == _workers(client)
    assert remote.status == "closed"
    assert len(_workers(client)) == 2


def test_cluster_connect_uses_dask_scheduler_address_setting(client: Client) -> None:
    with (
        dask.config.set({"scheduler-address": _address(client)}),
        DaskConfig().connect(num_workers=5) as remote,
    ):
        assert _address(remote) == _address(client)


def test_cluster_connect_starts_a_local_cluster_of_threads_and_closes_it() -> None:
    with DaskConfig().connect(num_workers=2) as own:
        workers = own.scheduler_info()["workers"].values()
        assert [w["nthreads"] for w in workers] == [1, 1]
        assert {w["host"] for w in workers} == {"127.0.0.1"}
        cluster = own.cluster
        assert cluster is not None
        assert all(isinstance(w, Worker) for w in cluster.workers.values())  # not Nannies
    assert own.status == "closed"
    assert cluster.status.name == "closed"


def test_cluster_connect_cluster_kwargs_override_local_defaults() -> None:
    with DaskConfig(cluster_kwargs={"threads_per_worker": 2}).connect(num_workers=1) as own:
        assert [w["nthreads"] for w in own.scheduler_info()["workers"].values()] == [2]


def test_cluster_connect_scales_a_cluster_class_and_waits_for_its_workers(
    client: Client,
) -> None:
    config = DaskConfig(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={"n_workers": 0, "processes": False, "dashboard_address": ":0"},
    )
    # cluster_class wins over Dask's scheduler-address setting
    with (
        dask.config.set({"scheduler-address": _address(client)}),
        config.connect(num_workers=2, wait=True) as own,
    ):
        assert _address(own) != _address(client)
        assert len(_workers(own)) == 2
    assert own.status == "closed"


def test_cluster_connect_waiting_for_too_many_workers_names_the_fix(client: Client) -> None:
    config = DaskConfig(address=_address(client), worker_timeout_s=0.01)
    with (
        pytest.raises(NotEnoughWorkersError, match=r"needs 3 Dask workers but .* has 2 after"),
        config.connect(num_workers=3, wait=True),
    ):
        pass


@pytest.mark.parametrize("path", ["dask_nowhere.Cluster", "distributed.NoSuchCluster", ""])
def test_cluster_class_that_cannot_be_imported_names_the_fix(path: str) -> None:
    with (
        pytest.raises(ConfigError, match=r"cannot be imported .*give a full import path"),
        connect(DaskConfig(cluster_class=path), num_workers=1),
    ):
        pass


def test_cluster_select_workers_ranks_sorted_addresses(client: Client) -> None:
    slots = select_workers(client, ScalingConfig(num_workers=2), timeout_s=0)
    assert [s.address for s in slots] == _workers(client)
    assert [(s.world_rank, s.local_rank, s.node_rank) for s in slots] == [(0, 0, 0), (1, 1, 0)]
    hosts = {w["host"] for w in client.scheduler_info()["workers"].values()}
    assert {(s.host, s.local_world_size) for s in slots} == {(hosts.pop(), 2)}


@pytest.mark.parametrize(("num_workers", "chosen"), [((1, 5), 2), ((1, 1), 1), ((2, 3), 2)])
def test_cluster_select_workers_elastic_takes_up_to_max(
    client: Client, num_workers: tuple[int, int], chosen: int
) -> None:
    slots = select_workers(client, ScalingConfig(num_workers=num_workers), timeout_s=0)
    assert [s.address for s in slots] == _workers(client)[:chosen]


def test_cluster_select_workers_skips_excluded_workers(client: Client) -> None:
    first, second = _workers(client)
    scaling = ScalingConfig(num_workers=(1, 2))
    slots = select_workers(client, scaling, timeout_s=0, exclude=frozenset({first}))
    assert [(s.address, s.world_rank) for s in slots] == [(second, 0)]


def test_cluster_select_workers_too_few_names_the_fix(client: Client) -> None:
    message = (
        rf"ScalingConfig\(num_workers=\(3, 4\)\) needs 3 Dask workers but "
        rf"{_address(client)} has 2 after 0 s; lower num_workers"
    )
    with pytest.raises(NotEnoughWorkersError, match=message) as raised:
        select_workers(client, ScalingConfig(num_workers=(3, 4)), timeout_s=0)
    assert (raised.value.requested, raised.value.available) == (3, 2)


def test_cluster_select_workers_stops_waiting_when_poll_raises(client: Client) -> None:
    calls: list[None] = []

    def poll() -> None:
        calls.append(None)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        select_workers(client, ScalingConfig(num_workers=3), timeout_s=600, poll=poll)
    assert len(calls) == 1


def test_cluster_select_workers_needs_the_requested_resources() -> None:
    with mixed_cluster({"cpu": {}, "gpu": {"resources": {"GPU": 1}}}) as (mixed, addresses):
        gpu_address = addresses["gpu"]
        scaling = ScalingConfig(num_workers=1, resources_per_worker={"GPU": 1})
        assert [s.address for s in select_workers(mixed, scaling, timeout_s=0)] == [gpu_address]
        two = ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1})
        with pytest.raises(
            NotEnoughWorkersError,
            match=r"needs 2 Dask workers with resources \{'GPU': 1\} but .* has 1 after",
        ):
            select_workers(mixed, two, timeout_s=0)


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_cluster_class_import_keeps_the_ctrl_c_handler() -> None:
    # dask_jobqueue's runner module sets SIGINT to sys.exit() when imported.
    code = (  # the default handler first: a background job's children inherit SIG_IGN
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from trainlib._internal.driver.cluster import _import_class; "
        "_import_class('dask_jobqueue.SLURMCluster'); "
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, count: int) -> None:
    """This host seems to have ``count`` NVIDIA GPUs (the workers are threads of this
    process, so they read the same driver folder) and no CUDA_VISIBLE_DEVICES."""
    folder = tmp_path / "gpus"
    folder.mkdir()
    for index in range(count):
        (folder / f"0000:0{index}:00.0").mkdir()
    monkeypatch.setattr(gpu_discovery, "_NVIDIA_GPUS_DIR", str(folder))
    monkeypatch.setattr(gpu_discovery, "nvml_devices", lambda: None)  # the folder, not NVML
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_cluster_gpu_ranks_take_one_device_each_by_worker_position(
    client: Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_gpus(monkeypatch, tmp_path, count=2)
    slots = select_workers(client, ScalingConfig(num_workers=2, use_gpu=True), timeout_s=5)
    assert [(s.address, s.device) for s in slots] == list(
        zip(_workers(client), ["0", "1"], strict=True)
    )


def test_cluster_more_gpu_ranks_than_devices_fail_at_once_naming_the_host(
    client: Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_gpus(monkeypatch, tmp_path, count=1)
    started = time.monotonic()
    with pytest.raises(
        NotEnoughWorkersError,
        match=r"needs 2 Dask workers with a GPU each but .* has 1 \(host \S+ has 1 "
        r"CUDA device\(s\) for its 2 Dask workers\); lower num_workers",
    ):
        select_workers(client, ScalingConfig(num_workers=2, use_gpu=True), timeout_s=60)
    assert time.monotonic() - started < 5  # not after the 60 s wait for workers
    [slot] = select_workers(client, ScalingConfig(num_workers=1, use_gpu=True), timeout_s=5)
    assert (slot.address, slot.device) == (_workers(client)[0], "0")


def test_cluster_class_workers_run_no_statistical_profiler() -> None:
    # sys._current_frames() every 10 ms deadlocked the driver once (CPython gh-106883)
    from dataclasses import dataclass, field
    from typing import Any

    from trainlib._internal.driver.cluster import _start_cluster

    @dataclass
    class Options:
        address: str | None = None
        cluster_class: str | None = "distributed.LocalCluster"
        cluster_kwargs: dict[str, Any] = field(
            default_factory=lambda: {"n_workers": 0, "processes": False}
        )
        adapt_kwargs: dict[str, Any] | None = None

    with _start_cluster(Options(), 1) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        profiling = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
    assert list(profiling.values()) == [False]


def test_cluster_select_workers_places_rays_accelerator_type_on_workers_labelled_with_it() -> None:
    labelled = {"resources": {"accelerator_type:A100": 1}}
    with mixed_cluster({"plain": {}, "a100": labelled}) as (mixed, addresses):
        a100 = addresses["a100"]
        scaling = ScalingConfig(num_workers=1, accelerator_type="A100")
        assert [s.address for s in select_workers(mixed, scaling, timeout_s=0)] == [a100]
        with pytest.raises(NotEnoughWorkersError, match="accelerator_type:H100"):
            select_workers(mixed, ScalingConfig(num_workers=1, accelerator_type="H100"), 0)
