"""A rank's kept shard: kept only within budget, read back in a seeded order per pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trainlib import ConfigError
from trainlib._internal.common.datasets import DatasetSource
from trainlib._internal.common.messages import CachePlan
from trainlib._internal.driver.run_plan import cache_plans
from trainlib.data import DataConfig
from trainlib.data.cache import CachedShard, ShardCollector

SHUFFLED = CachePlan(location="host", budget_bytes=10**6, shuffle=True, seed=7)
IN_ORDER = CachePlan(location="host", budget_bytes=10**6, shuffle=False, seed=7)


def _block(start: int, rows: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows)
    return {"id": ids, "image": np.repeat(ids.astype(np.uint8)[:, None], 4, axis=1)}


def _kept(*sizes: int, budget: int = 10**6) -> CachedShard | None:
    collector = ShardCollector("train", replace(SHUFFLED, budget_bytes=budget))
    start = 0
    for size in sizes:
        collector.add(_block(start, size))
        start += size
    return collector.finish()


def test_cache_keeps_a_shard_within_its_budget_as_columns() -> None:
    shard = _kept(3, 4)
    assert shard is not None
    assert shard.num_rows == 7 and shard.nbytes == 7 * 8 + 7 * 4
    assert shard.columns["id"].tolist() == list(range(7))


def test_cache_keeps_nothing_over_budget() -> None:
    assert _kept(3, 4, budget=7 * 12 - 1) is None
    assert _kept(3, 4, budget=7 * 12) is not None


def test_cache_passes_of_a_shuffled_split_differ_and_each_holds_every_row_once() -> None:
    shard = _kept(50, 50)
    assert shard is not None
    first, second = (shard.order(SHUFFLED, p, False, None) for p in (1, 2))
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(100))
    assert first.tolist() != second.tolist()
    assert first.tolist() == shard.order(SHUFFLED, 1, False, None).tolist()  # seeded


def test_cache_keeps_the_first_order_unless_asked_to_shuffle() -> None:
    shard = _kept(10)
    assert shard is not None
    assert shard.order(IN_ORDER, 3, False, None).tolist() == list(range(10))
    local = shard.order(IN_ORDER, 3, True, 5)  # local_shuffle_buffer_size given
    assert sorted(local.tolist()) == list(range(10)) and local.tolist() != list(range(10))


def test_cache_torch_batches_gather_rows_in_order_and_drop_the_short_one() -> None:
    shard = _kept(5, 5)
    assert shard is not None
    order = np.array([9, 0, 8, 1, 7, 2, 6, 3, 5, 4])
    batches = list(shard.torch_batches(order, 4, True, torch.device("cpu")))
    assert [b["id"].tolist() for b in batches] == [[9, 0, 8, 1], [7, 2, 6, 3]]
    assert batches[0]["image"][:, 0].tolist() == [9, 0, 8, 1]
    numpy_batches = list(shard.numpy_batches(order, 4, False))
    assert [b["id"].tolist() for b in numpy_batches][-1] == [5, 4]


def test_cache_plan_follows_the_data_config() -> None:
    source = DatasetSource("train", (), split=True, lengths=None)
    assert cache_plans(DataConfig(), [source], world_rank=0) == {}
    config = DataConfig(cache_shards="device", cache_budget_bytes=5, shuffle_seed=0)
    plan = cache_plans(config, [source], world_rank=1)["train"]
    assert (plan.location, plan.budget_bytes, plan.shuffle) == ("device", 5, True)
    assert plan.seed != cache_plans(config, [source], world_rank=0)["train"].seed
    unshuffled = DataConfig(cache_shards="host")  # no shuffle_seed: in order, as in Ray
    assert cache_plans(unshuffled, [source], world_rank=0)["train"].shuffle is False


def test_cache_config_rejects_an_unknown_place() -> None:
    with pytest.raises(ConfigError, match="needs 'off', 'host' or 'device'"):
        DataConfig(cache_shards="gpu")  # type: ignore[arg-type]
