"""Ray Train's DataParallelTrainer: TorchTrainer under Ray's name and arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import trainlib
from trainlib import ConfigError, RunConfig, ScalingConfig, TorchConfig
from trainlib.data_parallel_trainer import DataParallelTrainer


def _all_reduce_ranks(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    total = torch.tensor([trainlib.get_context().get_world_rank() + config["offset"]])
    dist.all_reduce(total)
    trainlib.report({"total": int(total.item()), "backend": dist.get_backend()})


def test_data_parallel_trainer_runs_every_rank_in_one_group(
    dask_client: Client, tmp_path: Path
) -> None:
    result = DataParallelTrainer(
        _all_reduce_ranks,
        train_loop_config={"offset": 10},
        backend_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path)),
        client=dask_client,
    ).fit()
    assert result.metrics == {"total": 21, "backend": "gloo"}  # (0 + 10) + (1 + 10)


class _HorovodConfig:
    pass


def test_data_parallel_trainer_refuses_other_backends_and_metadata() -> None:
    with pytest.raises(ConfigError, match=r"backend_config=_HorovodConfig\(...\).*TorchConfig"):
        DataParallelTrainer(_all_reduce_ranks, backend_config=_HorovodConfig())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"metadata=...\) is not supported"):
        DataParallelTrainer(_all_reduce_ranks, metadata={"team": "a"})
