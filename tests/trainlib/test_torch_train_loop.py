"""prepare_model, prepare_data_loader and get_device, in one process acting as a rank."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fsspec.implementations.local import LocalFileSystem
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from tests.helpers import set_single_rank_environment
from trainlib._internal.common.messages import RankSpec
from trainlib._internal.common.storage import RunStorage
from trainlib._internal.rank import session
from trainlib._internal.rank.process_globals import RANK
from trainlib.torch import get_device, prepare_data_loader, prepare_model
from trainlib.torch.train_loop import _DeviceDataLoader

StartRank = Callable[..., None]


@pytest.fixture
def start_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> StartRank:
    """Makes this process rank ``world_rank`` of ``world_size`` (the session only, no group)."""
    monkeypatch.setattr(RANK, "session", None)  # restored after the test

    def start(world_rank: int = 0, world_size: int = 1, use_gpu: bool = False) -> None:
        spec = RankSpec(
            world_rank=world_rank,
            local_rank=world_rank,
            node_rank=0,
            world_size=world_size,
            local_world_size=world_size,
            host="127.0.0.1",
            backend="gloo",
            timeout_s=30,
            use_gpu=use_gpu,
            run_name="run",
            storage=RunStorage(LocalFileSystem(), str(tmp_path)),
            start_index=0,
            latest_checkpoint=None,
            train_func_payload=b"",
        )
        RANK.start(session.Session(spec, lambda message: None))

    return start


@pytest.fixture
def process_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real gloo process group of one rank (what DistributedDataParallel needs)."""
    set_single_rank_environment(monkeypatch)
    dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def _batches(loader: DataLoader[Any]) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize(
    "call",
    [
        get_device,
        lambda: prepare_model(nn.Linear(1, 1)),
        lambda: prepare_data_loader(DataLoader(range(4))),
    ],
)
def test_train_loop_helpers_outside_a_training_function_say_where_to_call_them(
    start_rank: StartRank, call: Callable[[], object]
) -> None:
    with pytest.raises(RuntimeError, match=r"trainlib\.torch\..*\(\) was called outside a train"):
        call()


def test_get_device_is_the_cpu_when_use_gpu_is_false(start_rank: StartRank) -> None:
    start_rank()
    assert get_device() == torch.device("cpu")


def test_prepare_model_with_one_rank_returns_the_model(start_rank: StartRank) -> None:
    start_rank(world_size=1)
    model = nn.Linear(2, 1)
    assert prepare_model(model) is model


def test_prepare_model_without_parallel_strategy_does_not_wrap(start_rank: StartRank) -> None:
    start_rank(world_rank=1, world_size=2)
    model = nn.Linear(2, 1)
    assert prepare_model(model, parallel_strategy=None) is model


@pytest.mark.usefixtures("process_group")
def test_prepare_model_wraps_in_ddp_with_its_kwargs(start_rank: StartRank) -> None:
    start_rank(world_rank=0, world_size=2)  # the spec decides; DDP syncs over the group of one
    model = nn.Linear(2, 1)
    wrapped = prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": True})
    assert isinstance(wrapped, DistributedDataParallel)
    assert wrapped.module is model
    assert wrapped.find_unused_parameters is True


@pytest.mark.usefixtures("process_group")
def test_prepare_model_twice_names_the_mistake(start_rank: StartRank) -> None:
    start_rank(world_size=2)
    wrapped = prepare_model(nn.Linear(2, 1))
    with pytest.raises(TypeError, match=r"already prepared \(DistributedDataParallel\); pass the"):
        prepare_model(wrapped)


def test_prepare_model_unknown_strategy_names_the_choices(start_rank: StartRank) -> None:
    start_rank()
    with pytest.raises(ValueError, match=r"='deepspeed'\) must be 'ddp', 'fsdp' or None"):
        prepare_model(nn.Linear(2, 1), parallel_strategy="deepspeed")  # type: ignore[arg-type]


def test_prepare_model_fsdp_with_one_rank_returns_the_model(start_rank: StartRank) -> None:
    start_rank(world_size=1)
    model = nn.Linear(2, 1)
    assert prepare_model(model, parallel_strategy="fsdp") is model


def test_prepare_data_loader_with_one_rank_returns_the_loader(start_rank: StartRank) -> None:
    start_rank(world_size=1)
    loader = DataLoader(range(10), batch_size=4, shuffle=True)
    assert prepare_data_loader(loader) is loader


def test_prepare_data_loader_without_dist_sampler_keeps_the_loader(start_rank: StartRank) -> None:
    start_rank(world_rank=1, world_size=2)
    loader = DataLoader(range(10), batch_size=4)
    assert prepare_data_loader(loader, add_dist_sampler=False) is loader


def _negate(batch: list[int]) -> torch.Tensor:
    return -torch.tensor(batch)


def test_prepare_data_loader_gives_each_rank_its_shard_with_same_settings(
    start_rank: StartRank,
) -> None:
    start_rank(world_rank=1, world_size=2)
    loader = DataLoader(range(10), batch_size=3, drop_last=True, collate_fn=_negate)
    prepared = prepare_data_loader(loader)
    assert isinstance(prepared.sampler, DistributedSampler)
    assert prepared.sampler.shuffle is False
    # rank 1 takes rows 1, 3, 5, 7, 9; drop_last drops the short batch [7, 9]
    assert _batches(prepared) == [[-1, -3, -5]]
    assert (prepared.batch_size, prepared.drop_last, prepared.collate_fn) == (3, True, _negate)


def test_prepare_data_loader_shuffles_a_new_epoch_at_every_pass(start_rank: StartRank) -> None:
    start_rank(world_rank=0, world_size=2)
    prepared = prepare_data_loader(DataLoader(range(20), batch_size=20, shuffle=True))
    first, second = _batches(prepared), _batches(prepared)
    assert first != second
    assert prepared.sampler.shuffle is True  # type: ignore[attr-defined]
    prepared.sampler.set_epoch(0)  # type: ignore[attr-defined]
    assert _batches(prepared) == first


def test_prepare_data_loader_shards_are_disjoint_and_cover_the_data(
    start_rank: StartRank,
) -> None:
    rows: list[int] = []
    for rank in (0, 1, 2):
        start_rank(world_rank=rank, world_size=3)
        loader = prepare_data_loader(DataLoader(range(12), batch_size=12, shuffle=True))
        [shard] = _batches(loader)
        assert len(shard) == 4
        rows.extend(shard)
    assert sorted(rows) == list(range(12))


def test_prepare_data_loader_keeps_the_users_distributed_sampler(start_rank: StartRank) -> None:
    start_rank(world_rank=1, world_size=2)
    sampler = DistributedSampler(range(10), num_replicas=2, rank=1, shuffle=True, seed=7)
    loader = DataLoader(range(10), batch_size=5, sampler=sampler)
    assert prepare_data_loader(loader).sampler is sampler


class _Counting(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


def test_prepare_data_loader_leaves_an_iterable_dataset_to_the_user(
    start_rank: StartRank,
) -> None:
    start_rank(world_rank=1, world_size=2)
    loader = DataLoader(_Counting(), batch_size=2)
    assert _batches(prepare_data_loader(loader)) == [[0, 1], [2, 3]]


def test_prepare_data_loader_with_a_batch_sampler_says_how_to_shard(
    start_rank: StartRank,
) -> None:
    start_rank(world_rank=1, world_size=2)
    batches = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    with pytest.raises(
        TypeError, match=r"needs a DataLoader built with batch_size.*add_dist_sampler=False"
    ):
        prepare_data_loader(DataLoader(range(10), batch_sampler=batches))


def test_device_loader_moves_nested_batches_and_keeps_their_shape() -> None:
    def collate(rows: list[int]) -> dict[str, Any]:
        values = torch.tensor(rows)
        return {"x": values, "pair": (values, [values * 2]), "ids": rows}

    base = DataLoader(range(5), batch_size=2, collate_fn=collate)
    loader = _DeviceDataLoader(base, torch.device("meta"))  # a device every host has
    [first, *_] = list(loader)
    assert len(loader) == len(base) == 3
    assert first["x"].device.type == "meta"
    assert isinstance(first["pair"], tuple) and isinstance(first["pair"][1], list)
    assert first["pair"][0].device.type == first["pair"][1][0].device.type == "meta"
    assert first["ids"] == [0, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prepare_with_gpu_moves_model_and_batches_to_the_ranks_device(
    start_rank: StartRank,
) -> None:
    start_rank(use_gpu=True)
    assert get_device() == torch.device("cuda", 0)  # the supervisor makes one device visible
    model = prepare_model(nn.Linear(2, 1))
    assert next(model.parameters()).device.type == "cuda"
    loader = prepare_data_loader(DataLoader(torch.arange(6.0).reshape(3, 2), batch_size=2))
    assert [batch.device.type for batch in loader] == ["cuda", "cuda"]


REPRODUCIBLE = """
import torch
from trainlib.torch import backward, enable_reproducibility, prepare_optimizer

def once():
    enable_reproducibility(seed=7)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert prepare_optimizer(optimizer) is optimizer
    loss = model(torch.randn(8, 4)).pow(2).mean()
    backward(loss)
    optimizer.step()
    return model.weight.detach().clone()

first, second = once(), once()
assert torch.equal(first, second)
assert torch.are_deterministic_algorithms_enabled()
assert not torch.backends.cudnn.benchmark
print("same")
"""


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_torch_ray_helpers_make_runs_repeatable() -> None:
    """Ray's enable_reproducibility, prepare_optimizer and backward (in a process of its own:
    they set torch's global determinism)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", REPRODUCIBLE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "same"
