"""GPU placement against the topologies users run, each case written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainlib._internal.common.devices import (
    HostShortage,
    WorkerDevices,
    assign_devices,
    device_key,
    duplicate_devices,
    missing_kernels,
    parse_visible,
    place,
    pool,
    shortages,
    visible_together,
)
from trainlib._internal.common.gpu_discovery import driver_devices, probe_worker_devices
from trainlib._internal.driver.ranks import assign_ranks, device_index


def _workers(host: str, lists: list[str | None], device_count: int) -> list[WorkerDevices]:
    return [
        WorkerDevices(
            f"tcp://{host}:{4000 + i}", host, None if v is None else parse_visible(v), device_count
        )
        for i, v in enumerate(lists)
    ]


def test_devices_a_list_every_local_worker_inherits_is_divided_between_them() -> None:
    # export CUDA_VISIBLE_DEVICES=2,3 with the default LocalCluster (workers share the env)
    workers = _workers("h", ["2,3", "2,3"], device_count=4)
    assert assign_devices(workers) == {"tcp://h:4000": "2", "tcp://h:4001": "3"}


def test_devices_a_slurm_job_list_gives_each_of_its_workers_one_entry() -> None:
    workers = _workers("node7", ["0,1,2,3,4,5,6,7"] * 8, device_count=8)
    assigned = assign_devices(workers)
    assert [assigned[w.address] for w in workers] == ["0", "1", "2", "3", "4", "5", "6", "7"]


def test_devices_dask_cuda_rotated_lists_give_each_worker_its_own_first_entry() -> None:
    workers = _workers("h", ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"], device_count=4)
    assigned = assign_devices(workers)
    assert [assigned[w.address] for w in workers] == ["0", "1", "2", "3"]


def test_devices_one_gpu_without_a_list_serves_one_of_two_workers() -> None:
    workers = _workers("h", [None, None], device_count=1)
    assigned = assign_devices(workers)
    assert assigned == {"tcp://h:4000": "0", "tcp://h:4001": None}
    assert shortages(workers, assigned) == [HostShortage("h", num_devices=1, num_workers=2)]


def test_devices_positions_count_per_host_and_ignore_worker_order() -> None:
    workers = _workers("b", [None, None], 2) + _workers("a", [None, None], 2)
    assigned = assign_devices(list(reversed(workers)))
    assert assigned == {
        "tcp://a:4000": "0",
        "tcp://a:4001": "1",
        "tcp://b:4000": "0",
        "tcp://b:4001": "1",
    }
    assert shortages(workers, assigned) == []


def test_devices_concurrent_trials_on_one_host_take_different_devices() -> None:
    # two 1-rank trials, each leasing one of the host's 3 workers: the device follows the
    # worker's place among all of the host's workers, not the trial's local rank (0 for both)
    workers = _workers("h", [None, None, None], device_count=3)
    assigned = assign_devices(workers)
    trial_a, trial_b = "tcp://h:4000", "tcp://h:4002"
    assert (assigned[trial_a], assigned[trial_b]) == ("0", "2")


def test_devices_uuid_lists_are_divided_like_indices() -> None:
    workers = _workers("h", ["GPU-aa,GPU-bb"] * 2, device_count=8)
    assert assign_devices(workers) == {"tcp://h:4000": "GPU-aa", "tcp://h:4001": "GPU-bb"}


def test_devices_an_empty_list_hides_every_device() -> None:
    workers = _workers("h", [""], device_count=2)
    assert assign_devices(workers) == {"tcp://h:4000": None}


def test_devices_a_shared_list_shorter_than_the_workers_leaves_the_rest_without() -> None:
    workers = _workers("h", ["5"] * 3, device_count=8)
    assigned = assign_devices(workers)
    assert [assigned[w.address] for w in workers] == ["5", None, None]
    assert shortages(workers, assigned) == [HostShortage("h", num_devices=1, num_workers=3)]


def test_devices_a_host_without_gpus_has_none() -> None:
    workers = _workers("cpu", [None, None], device_count=0)
    assert set(assign_devices(workers).values()) == {None}


def test_devices_duplicate_uuids_on_one_host_name_the_ranks_and_the_fix() -> None:
    ranks = [(0, "h1", "GPU-a"), (1, "h1", "GPU-b"), (2, "h2", "GPU-a"), (3, "h1", "GPU-a")]
    message = duplicate_devices(ranks)
    assert message is not None
    assert message.startswith("ranks 0, 3 on host h1 were all given GPU GPU-a;")
    assert "one CUDA_VISIBLE_DEVICES entry per worker" in message


def test_devices_the_same_uuid_on_two_hosts_is_no_duplicate() -> None:
    assert duplicate_devices([(0, "h1", "GPU-a"), (1, "h2", "GPU-a")]) is None


def _slurm_job(host: str, first_port: int, job_gpus: str, workers: int) -> list[WorkerDevices]:
    """One SLURM job's worker processes on ``host`` under ConstrainDevices: its cgroup shows
    them its GPUs counted from 0, SLURM_JOB_GPUS names them in the host's numbering."""
    jobs = parse_visible(job_gpus)
    visible = tuple(str(i) for i in range(len(jobs)))
    return [
        WorkerDevices(f"tcp://{host}:{first_port + i}", host, visible, 8, jobs)
        for i in range(workers)
    ]


def test_devices_slurm_jobs_sharing_a_node_each_divide_their_own_gpus() -> None:
    # two jobs of --gres=gpu:2 and 2 worker processes each, on one 8-GPU node: every worker
    # sees CUDA_VISIBLE_DEVICES=0,1, but the jobs hold GPUs 2,3 and 6,7
    first, second = _slurm_job("n1", 4000, "2,3", 2), _slurm_job("n1", 5000, "6,7", 2)
    assigned = assign_devices(first + second)
    assert [assigned[w.address] for w in first + second] == ["0", "1", "0", "1"]
    assert shortages(first + second, assigned) == []


def test_devices_one_gpu_slurm_jobs_on_one_node_each_take_their_only_device() -> None:
    jobs = _slurm_job("n1", 4000, "3", 1) + _slurm_job("n1", 5000, "5", 1)
    assert assign_devices(jobs) == {"tcp://n1:4000": "0", "tcp://n1:5000": "0"}


def test_devices_workers_sharing_a_list_divide_it_beside_a_worker_with_its_own() -> None:
    workers = _workers("h", ["0,1", "0,1", "2"], device_count=4)
    assigned = assign_devices(workers)
    assert [assigned[w.address] for w in workers] == ["0", "1", "2"]


def test_devices_probe_reads_the_list_and_slurms_own_numbering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("SLURM_JOB_GPUS", "2,3")
    monkeypatch.delenv("SLURM_STEP_GPUS", raising=False)
    visible, _, job, *_ = probe_worker_devices()
    assert (visible, job) == (("0", "1"), ("2", "3"))
    monkeypatch.setenv("SLURM_STEP_GPUS", "3")  # a job step's own devices come first
    assert probe_worker_devices()[2] == ("3",)
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        monkeypatch.delenv(name)
    assert probe_worker_devices()[0:3:2] == (None, None)


def test_devices_dask_cuda_inside_one_slurm_job_still_gives_each_worker_its_first_entry() -> None:
    lists = ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"]  # dask-cuda's rotations, one job
    workers = [
        WorkerDevices(f"tcp://n1:{4000 + i}", "n1", parse_visible(v), 4, ("4", "5", "6", "7"))
        for i, v in enumerate(lists)
    ]
    assigned = assign_devices(workers)
    assert [assigned[w.address] for w in workers] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        ("-1", ()),  # the usual way to hide every device
        ("NoDevFiles", ()),  # what some batch systems export for a job without GPUs
        ("0,-1,1", ("0",)),  # CUDA stops reading at the first invalid entry
        (" 1 , GPU-ab ,MIG-cd", ("1", "GPU-ab", "MIG-cd")),
        ("", ()),
    ],
)
def test_devices_the_list_is_read_as_cuda_reads_it(value: str, entries: tuple[str, ...]) -> None:
    assert parse_visible(value) == entries


def test_devices_a_worker_hiding_its_devices_or_on_a_host_without_gpus_is_offered_none() -> None:
    hidden = _workers("h", ["-1", "NoDevFiles"], device_count=4)
    listed_without_gpus = _workers("cpu", ["0,1"], device_count=0)
    for worker in hidden + listed_without_gpus:
        assert pool(worker) == ()
    assert set(assign_devices(hidden + listed_without_gpus).values()) == {None}


def test_devices_a_leased_device_sends_the_worker_to_the_next_free_one() -> None:
    # another run holds GPUs 0 and 2: the workers preferring them take 1 and 3 instead
    workers = _workers("h", [None] * 4, device_count=4)
    held = {"h/0", "h/2"}
    placed = place(workers, wanted=2, take=lambda key: key not in held)
    assert placed == {"tcp://h:4000": "1", "tcp://h:4001": "3"}
    assert place(workers, wanted=4, take=lambda key: key not in held) == placed


def test_devices_keys_name_the_hosts_gpu_whatever_the_cgroup_numbering() -> None:
    first, second = _slurm_job("n1", 4000, "2,3", 2), _slurm_job("n1", 5000, "6,7", 2)
    keys = {device_key(w, "1") for w in first} | {device_key(w, "1") for w in second}
    assert keys == {"n1/3", "n1/7"}
    own = WorkerDevices("tcp://n1:1", "n1", ("GPU-ab",), 8)
    assert device_key(own, "GPU-ab") == "n1/GPU-ab"
    rotated = _workers("h", ["1,2,3,0"], device_count=4)[0]
    assert device_key(rotated, "1") == "h/1"


def test_devices_ranks_of_a_host_see_each_others_devices_in_rank_order() -> None:
    workers = [("a", "tcp://a:1"), ("a", "tcp://a:2"), ("b", "tcp://b:1"), ("b", "tcp://b:2")]
    placed = {"tcp://a:1": "3", "tcp://a:2": "1", "tcp://b:1": "0", "tcp://b:2": "1"}
    slots = assign_ranks(workers, placed)
    assert [(s.visible_devices, device_index(s)) for s in slots] == [
        (("3", "1"), 0),
        (("3", "1"), 1),
        (("0", "1"), 0),
        (("0", "1"), 1),
    ]


def test_devices_ranks_numbered_apart_or_in_two_forms_see_only_their_own() -> None:
    workers = [("n", "tcp://n:1"), ("n", "tcp://n:2")]
    two_jobs = assign_ranks(
        workers, {"tcp://n:1": "0", "tcp://n:2": "0"}, {"tcp://n:1": ("2",), "tcp://n:2": ("6",)}
    )
    assert [(s.visible_devices, device_index(s)) for s in two_jobs] == [(("0",), 0), (("0",), 0)]
    mixed = assign_ranks(workers, {"tcp://n:1": "GPU-ab", "tcp://n:2": "1"})
    assert [s.visible_devices for s in mixed] == [("GPU-ab",), ("1",)]
    assert visible_together(["GPU-ab", "GPU-cd"]) == ("GPU-ab", "GPU-cd")


CUDA13_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


@pytest.mark.parametrize(
    ("capability", "arches", "runs"),
    [
        ((7, 0), CUDA13_ARCHES, False),  # a V100 on the CUDA 13 wheel: "no kernel image"
        ((6, 0), CUDA13_ARCHES, False),  # a P100
        ((7, 5), CUDA13_ARCHES, True),  # a T4
        ((8, 9), CUDA13_ARCHES, True),  # an L4 runs sm_86's cubin (same major, lower minor)
        ((7, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_90"], True),  # cu126
        ((12, 1), ["sm_90", "compute_90"], True),  # PTX is compiled for newer GPUs
        ((9, 0), [], True),  # a CPU build says nothing here (use_gpu fails before)
    ],
)
def test_devices_a_gpu_without_kernels_in_the_installed_torch_is_named(
    capability: tuple[int, int], arches: list[str], runs: bool
) -> None:
    message = missing_kernels(capability, arches)
    assert (message is None) is runs
    if message is not None:
        assert f"compute capability {capability[0]}.{capability[1]}" in message
        assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126" in message


# Faked discovery of one host with four GPUs, as NVML (or the driver's folder) names them in
# PCI bus order.
UUIDS = ("GPU-aaaa0000", "GPU-bbbb1111", "GPU-cccc2222", "GPU-dddd3333")


def _host(
    visible: str | None, job: str | None = None, uuids: tuple[str, ...] = UUIDS
) -> WorkerDevices:
    return WorkerDevices(
        "tcp://n:1", "n", None if visible is None else parse_visible(visible), len(uuids),
        None if job is None else parse_visible(job), uuids,
    )  # fmt: skip


def test_devices_an_index_and_the_uuid_of_one_gpu_are_one_claim() -> None:
    # before: "n/0" and "n/GPU-aaaa0000", two locks on one GPU, so two runs could share it
    by_index, by_uuid = _host("0,1"), _host("GPU-aaaa0000,GPU-bbbb1111")
    assert device_key(by_index, "0") == device_key(by_uuid, "GPU-aaaa0000") == "n/GPU-aaaa0000"
    assert device_key(_host("GPU-bbbb"), "GPU-bbbb") == "n/GPU-bbbb1111"  # CUDA takes a prefix


def test_devices_a_rotated_list_in_a_job_without_constrained_devices_keys_each_gpu_once() -> None:
    # job GPUs 1,2,3; dask-cuda gives a worker 3,1,2 (no cgroup: the host's numbering)
    rotated = _host("3,1,2", job="1,2,3")
    assert [device_key(rotated, e) for e in ("3", "1", "2")] == [
        "n/GPU-dddd3333", "n/GPU-bbbb1111", "n/GPU-cccc2222",
    ]  # fmt: skip
    # another run holds physical 1 and 3: the worker is offered physical 2 only (before, entry 1
    # was keyed n/2 and entry 2 n/3, so place() gave physical 1, which the other run used)
    held = {"n/GPU-bbbb1111", "n/GPU-dddd3333"}
    assert place([rotated], wanted=1, take=lambda key: key not in held) == {"tcp://n:1": "2"}
    # without UUIDs (no NVML, no driver folder), the host's numbering: a rotation is no cgroup
    bare = WorkerDevices("tcp://n:1", "n", ("3", "1", "2"), 4, ("1", "2", "3"))
    assert [device_key(bare, e) for e in ("3", "1", "2")] == ["n/3", "n/1", "n/2"]


def test_devices_a_constrained_slurm_job_counts_from_zero_and_keys_the_physical_gpu() -> None:
    # ConstrainDevices: the job of GPUs 2,3 sees them as 0,1, and so does NVML inside it
    job = _host("0,1", job="2,3", uuids=UUIDS[2:])
    assert [device_key(job, e) for e in ("0", "1")] == ["n/GPU-cccc2222", "n/GPU-dddd3333"]
    outside = _host("GPU-cccc2222")  # the same GPU named by another worker of the host
    assert device_key(outside, "GPU-cccc2222") == device_key(job, "0")


def test_devices_mig_devices_are_the_pool_each_taken_and_seen_alone() -> None:
    migs = ("MIG-1111", "MIG-2222", "MIG-3333")  # one GPU in MIG mode: three devices
    worker = _host(None, uuids=migs)
    assert pool(worker) == migs  # by UUID: CUDA takes MIG devices no other way
    assert assign_devices([worker]) == {"tcp://n:1": "MIG-1111"}
    assert device_key(worker, "MIG-2222") == "n/MIG-2222"
    assert visible_together(["MIG-1111", "MIG-2222"]) == ()  # a process sees one MIG device
    assert visible_together(["GPU-aaaa0000", "GPU-bbbb1111"]) == ("GPU-aaaa0000", "GPU-bbbb1111")


def test_devices_two_ranks_of_a_run_never_get_slices_of_one_gpu() -> None:
    """NCCL refuses two ranks of one group on MIG devices of one GPU ("Duplicate GPU
    detected"): a worker is given a slice of another GPU, or none."""
    slices = ("MIG-a1", "MIG-a2", "MIG-b1")
    parents = (("MIG-a1", "GPU-a"), ("MIG-a2", "GPU-a"), ("MIG-b1", "GPU-b"))
    workers = [
        WorkerDevices(f"tcp://n:{port}", "n", None, 3, None, slices, (), parents)
        for port in (1, 2, 3)
    ]
    placed = place(workers, 3)
    assert sorted(placed.values()) == ["MIG-a1", "MIG-b1"]  # the third would share GPU a
    one_gpu = [
        WorkerDevices(w.address, "n", None, 2, None, slices[:2], (), parents) for w in workers
    ]
    assert len(place(one_gpu, 2)) == 1
    by_index = WorkerDevices("tcp://n:9", "n", ("1",), 3, None, slices, (), parents)
    assert device_key(by_index, "1") == "n/GPU-b"  # GPU 1, not the second slice of GPU 0
    assert device_key(by_index, "0") == "n/GPU-a"


def test_devices_the_driver_folder_gives_uuids_in_pci_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trainlib._internal.common import gpu_discovery

    for bus, uuid in (("0000:41:00.0", "GPU-bbbb1111"), ("0000:01:00.0", "GPU-aaaa0000")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: X\nGPU UUID: {uuid}\nIRQ: 1\n")
    monkeypatch.setattr(gpu_discovery, "_NVIDIA_GPUS_DIR", str(tmp_path))
    assert driver_devices() == (2, ("GPU-aaaa0000", "GPU-bbbb1111"))
    (tmp_path / "0000:81:00.0").mkdir()  # one GPU whose UUID cannot be read: count only
    assert driver_devices() == (3, None)
