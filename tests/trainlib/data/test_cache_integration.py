"""Kept shards in real ranks: after one complete pass, later passes compute nothing on Dask,
and every rank still reads its own equal share, reshuffled per pass."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch.distributed as dist
from distributed import Client

import trainlib
from trainlib import DataConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer

ROWS = 400  # 4 partitions of 100


def mark_computed(frame: pd.DataFrame, marks: str) -> pd.DataFrame:
    """The transform: leaves a file each time Dask computes a partition."""
    Path(marks, uuid.uuid4().hex).touch()
    return frame


def read_three_passes(config: dict[str, Any]) -> None:
    """Maybe an unfinished pass, then three whole ones; each rank records the ids of every
    pass and how many partition computations had happened once all ranks ended it."""
    shard = trainlib.get_dataset_shard("train")
    if config["abandon_first"]:
        next(iter(shard.iter_torch_batches(batch_size=8)))
    passes, computed = [], []
    for _ in range(3):
        passes.append([i for b in shard.iter_torch_batches(batch_size=8) for i in b["id"].tolist()])
        dist.barrier()
        computed.append(len(list(Path(config["marks"]).iterdir())))
        # No rank starts the next pass (and computes its partitions) before every rank has
        # counted this one's.
        dist.barrier()
    rank = trainlib.get_context().get_world_rank()
    record = {"passes": passes, "computed": computed}
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(record))
    trainlib.report({"rows": len(passes[0])})


def _run(client: Client, tmp_path: Path, cache: str, abandon_first: bool) -> list[dict[str, Any]]:
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    out.mkdir()
    frame = pd.DataFrame({"id": np.arange(ROWS), "x": np.ones(ROWS, np.float32)})
    train = dd.from_pandas(frame, npartitions=4).map_partitions(
        mark_computed, str(marks), meta=frame.iloc[:0]
    )
    TorchTrainer(
        read_three_passes,
        train_loop_config={"marks": str(marks), "out": str(out), "abandon_first": abandon_first},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        datasets={"train": train},
        dataset_config=DataConfig(cache_shards=cache, shuffle_seed=0),  # type: ignore[arg-type]
        client=client,
    ).fit()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("abandon_first", [False, True])
def test_cache_later_passes_compute_nothing_and_keep_equal_shares(
    dask_client: Client, tmp_path: Path, abandon_first: bool
) -> None:
    ranks = _run(dask_client, tmp_path, "host", abandon_first)
    for record in ranks:
        first, second, third = record["passes"]
        assert len(first) == ROWS // 2
        assert set(first) == set(second) == set(third)  # the same rows every pass
        assert first != second != third  # reshuffled locally each pass
        computed = record["computed"]
        assert computed[0] > 0 and computed[1] == computed[2] == computed[0]
    assert not set(ranks[0]["passes"][0]) & set(ranks[1]["passes"][0])


def test_cache_off_computes_every_pass_again(dask_client: Client, tmp_path: Path) -> None:
    [rank0, _] = _run(dask_client, tmp_path, "off", abandon_first=False)
    assert rank0["computed"][0] < rank0["computed"][1] < rank0["computed"][2]
