"""Dask collections streamed into real ranks: equal shares, each row once, transforms on the
workers, recompute after a lost worker, a restarted pass after a rank death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist
from distributed import Client, LocalCluster, wait

import trainlib
from trainlib import DataConfig, DatasetError, FailureConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

LENGTHS = (300, 250, 333, 118)  # 1,001 rows: a 2-rank pass drops one
VAL_ROWS = 50


def _write_parquet(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for index, count in enumerate(LENGTHS):
        ids = np.arange(start, start + count)
        images = [np.full(12, i % 251, np.uint8).tobytes() for i in ids]
        pq.write_table(pa.table({"id": ids, "image": images}), root / f"part{index}.parquet")
        start += count
    return root


def decode(frame: pd.DataFrame) -> pd.DataFrame:
    """The transform: bytes to (3, 2, 2) arrays, plus the pid of the process running it."""
    return frame.assign(
        image=[np.frombuffer(b, np.uint8).reshape(3, 2, 2) for b in frame["image"]],
        pid=os.getpid(),
    )


def read_passes(config: dict[str, Any]) -> None:
    """Two passes over "train" and one over "val"; each rank writes what it saw."""
    context = trainlib.get_context()
    train = trainlib.get_dataset_shard("train")
    record: dict[str, Any] = {"pid": os.getpid(), "train": [], "val": [], "transform_pids": []}
    for _ in range(2):
        ids = []
        for batch in train.iter_torch_batches(batch_size=64):
            assert tuple(batch["image"].shape[1:]) == (3, 2, 2)
            ids += batch["id"].tolist()
            record["transform_pids"] += sorted(set(batch["pid"].tolist()))
        record["train"].append(ids)
    for batch in trainlib.get_dataset_shard("val").iter_torch_batches(batch_size=16):
        assert batch["image"].dtype.is_floating_point is False and batch["image"].ndim == 4
        record["val"] += batch["label"].tolist()
    Path(config["out"], f"rank{context.get_world_rank()}.json").write_text(json.dumps(record))
    trainlib.report({"rows": len(record["train"][0])})


def test_ingest_splits_rows_equally_each_once_with_transforms_on_workers(
    dask_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Also Ray Data's execution options, per dataset as Ray's page sets them: hints that
    never stop the run; the limit Dask cannot apply is named in a warning."""
    train_options = DataConfig.default_ingest_options()
    train_options.resource_limits.object_store_memory = 10e9
    val_options = DataConfig.default_ingest_options()
    val_options.preserve_order = True  # what an unsplit dataset gets anyway
    train = dd.read_parquet(_write_parquet(tmp_path / "train")).map_partitions(
        decode, meta={"id": "i8", "image": object, "pid": "i8"}
    )
    val = {
        "image": da.zeros((VAL_ROWS, 3, 4, 4), dtype=np.uint8, chunks=(20, 3, 4, 4)),
        "label": da.arange(VAL_ROWS, chunks=20),
    }
    TorchTrainer(
        read_passes,
        train_loop_config={"out": str(tmp_path)},
        datasets={"train": train, "val": val},
        dataset_config=DataConfig(
            datasets_to_split=["train"],
            shuffle_seed=0,
            execution_options={"train": train_options, "val": val_options},
        ),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    (hint,) = [m for m in caplog.messages if "execution options" in m]
    assert "execution_options['train'].resource_limits" in hint and "'val'" not in hint
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    ends = set(np.cumsum(LENGTHS) - 1)  # a pass drops the last row of its last partition
    for epoch in range(2):
        shares = [set(rank["train"][epoch]) for rank in ranks]
        assert [len(rank["train"][epoch]) for rank in ranks] == [500, 500]
        assert not shares[0] & shares[1]
        (dropped,) = set(range(sum(LENGTHS))) - shares[0] - shares[1]
        assert dropped in ends
    assert ranks[0]["train"][0] != ranks[0]["train"][1]  # another partition order per pass
    for rank in ranks:
        assert rank["val"] == list(range(VAL_ROWS))  # not split: every rank, every row, in order
        assert rank["pid"] not in rank["transform_pids"]
        assert not {r["pid"] for r in ranks} & set(rank["transform_pids"])


def read_shuffled(config: dict[str, Any]) -> None:
    """Two passes over "val" through a local shuffle buffer, in one batch each."""
    shard = trainlib.get_dataset_shard("val")
    orders = [
        [
            i
            for b in shard.iter_batches(batch_size=VAL_ROWS, **config["shuffle"])
            for i in b["label"]
        ]
        for _ in range(2)
    ]
    rank = trainlib.get_context().get_world_rank()
    Path(config["out"], f"shuffled{rank}.json").write_text(json.dumps(orders, default=int))
    trainlib.report({})


def test_ingest_local_shuffle_orders_rows_per_rank_and_epoch_and_is_seeded(
    dask_client: Client, tmp_path: Path
) -> None:
    def orders(run: str) -> list[list[list[int]]]:
        val = {"label": da.arange(VAL_ROWS, chunks=20)}
        shuffle = {"local_shuffle_buffer_size": VAL_ROWS, "local_shuffle_seed": 3}
        TorchTrainer(
            read_shuffled,
            train_loop_config={"out": str(tmp_path), "shuffle": shuffle},
            datasets={"val": val},
            dataset_config=DataConfig(datasets_to_split=[]),  # every rank reads every row
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name=run, storage_path=str(tmp_path / "runs")),
            client=dask_client,
        ).fit()
        return [json.loads((tmp_path / f"shuffled{r}.json").read_text()) for r in range(2)]

    first = orders("first")
    seen = [tuple(order) for rank in first for order in rank]  # 2 ranks x 2 epochs
    assert all(sorted(order) == list(range(VAL_ROWS)) for order in seen)  # each row once
    assert len(set(seen)) == 4 and tuple(range(VAL_ROWS)) not in seen
    assert orders("again") == first  # the same seed: the same orders


def read_list_column(config: dict[str, Any]) -> None:
    """One pass of torch batches over a column of lists ``[i, i + 0.5, 1]``: reports the
    row shapes, the rows, and whether every row kept its values in order."""
    shapes, rows, intact = set(), 0, True
    for batch in trainlib.get_dataset_shard("train").iter_torch_batches(batch_size=4):
        features = batch["features"]
        shapes.add(tuple(features.shape[1:]))
        rows += len(features)
        intact &= bool(((features[:, 1] - features[:, 0] == 0.5) & (features[:, 2] == 1)).all())
    trainlib.report({"shapes": sorted(shapes), "rows": rows, "intact": intact})


def test_ingest_a_column_of_lists_arrives_as_one_tensor(
    dask_client: Client, tmp_path: Path
) -> None:
    root = tmp_path / "lists"
    root.mkdir()
    for part in range(2):  # Parquet list<double>: what a list column is on disk
        rows = range(part * 8, part * 8 + 8)
        table = pa.table({"features": [[float(i), float(i) + 0.5, 1.0] for i in rows]})
        pq.write_table(table, root / f"part{part}.parquet")
    result = TorchTrainer(
        read_list_column,
        datasets={"train": dd.read_parquet(root)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert result.metrics == {"shapes": [[3]], "rows": 8, "intact": True}  # rank 0's half, as JSON


def test_ingest_fewer_rows_than_ranks_fails_before_any_rank_starts(
    dask_client: Client, tmp_path: Path
) -> None:
    one_row = dd.from_pandas(pd.DataFrame({"x": [1.0]}), npartitions=1)
    trainer = TorchTrainer(
        read_passes,
        train_loop_config={"out": str(tmp_path)},
        datasets={"train": one_row},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    )
    with pytest.raises(DatasetError, match=r"datasets\['train'\] has 1 rows for 2 ranks"):
        trainer.fit()
    assert not list(tmp_path.glob("rank*.json"))


def read_one_pass(config: dict[str, Any]) -> None:
    for _ in trainlib.get_dataset_shard("train").iter_batches(batch_size=4):
        pass


def test_ingest_partition_smaller_than_its_metadata_says_names_it(
    dask_client: Client, tmp_path: Path
) -> None:
    """Rows are planned from Dask's metadata; a partition that holds fewer fails the run with a
    message naming it (not a silent uneven split that could hang DDP)."""
    short = dask.delayed(np.arange)(5)  # declared below as 10 rows
    x = da.concatenate(
        [da.arange(10, chunks=10), da.from_delayed(short, shape=(10,), dtype=np.int64)]
    )
    trainer = TorchTrainer(
        read_one_pass,
        datasets={"train": {"x": x}},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    )
    with pytest.raises(
        trainlib.WorkerGroupError, match=r"Partition 1 of datasets\['train'\] has 5"
    ):
        trainer.fit()


def pass_with_faults(config: dict[str, Any]) -> None:
    """One pass; in the first attempt rank 1 dies after its first batch."""
    out = Path(config["out"])
    rank = trainlib.get_context().get_world_rank()
    ids: list[int] = []
    for batch in trainlib.get_dataset_shard("train").iter_torch_batches(batch_size=32):
        ids += batch["id"].tolist()
        if rank == 1 and not (out / "rank-died").exists():
            (out / "rank-died").touch()
            os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # a rank of a failed attempt never gets past here
    (out / f"rank{rank}.json").write_text(json.dumps(ids))
    trainlib.report({"rows": len(ids)})


def kill_data_worker_once(frame: pd.DataFrame, out: str, pid: int) -> pd.DataFrame:
    """After the rank's death, the second call kills the worker holding the source data.

    Calls run in several worker processes at once: each mark is made by exactly one of them
    (an exclusive create), so one call is the second and one kills, whatever the interleaving.
    """
    marks = Path(out)
    died = (marks / "rank-died").exists()
    second = died and not _created(marks / "first-call-after-death")
    if second and _created(marks / "worker-killed"):
        os.kill(pid, signal.SIGKILL)
    return decode(frame)


def _created(path: Path) -> bool:
    """Create ``path``; False if it existed (O_EXCL: one process of many wins)."""
    try:
        path.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


@dataclass
class DataWorkerCluster:
    """A cluster whose source data lives on one worker (no nanny) that hosts no rank."""

    cluster: LocalCluster
    client: Client
    data_worker: subprocess.Popen[bytes]


@pytest.fixture
def data_worker_cluster() -> Iterator[DataWorkerCluster]:
    with (
        LocalCluster(
            n_workers=0,
            threads_per_worker=1,
            processes=True,
            resources={"rank": 1},
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address),
                *("--nthreads", "1", "--no-nanny", "--no-dashboard"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client.wait_for_workers(1, timeout=60)
            yield DataWorkerCluster(cluster, client, worker)
        finally:
            worker.kill()
            worker.wait()


def test_ingest_restarted_rank_restarts_the_pass_and_lost_worker_is_recomputed(
    data_worker_cluster: DataWorkerCluster, tmp_path: Path
) -> None:
    client = data_worker_cluster.client
    # Persisted while the data worker is the only one: its partitions are on it, unrestricted,
    # so Dask may recompute them anywhere once it is gone.
    source = client.persist(dd.read_parquet(_write_parquet(tmp_path / "train")))
    wait(source)
    data_worker_cluster.cluster.scale(2)  # two workers that can host ranks
    client.wait_for_workers(3, timeout=60)
    train = source.map_partitions(
        kill_data_worker_once,
        str(tmp_path),
        data_worker_cluster.data_worker.pid,
        meta={"id": "i8", "image": object, "pid": "i8"},
    )
    result = TorchTrainer(
        pass_with_faults,
        train_loop_config={"out": str(tmp_path)},
        datasets={"train": train},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"rank": 1}),
        run_config=RunConfig(
            storage_path=str(tmp_path / "runs"), failure_config=FailureConfig(max_failures=1)
        ),
        client=client,
    ).fit()
    assert (tmp_path / "worker-killed").exists()
    assert data_worker_cluster.data_worker.wait(timeout=30) == -signal.SIGKILL
    assert result.num_restarts == 1  # the rank's death; the lost worker cost a recompute
    shares = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [len(s) for s in shares] == [500, 500]
    assert len(set(shares[0]) | set(shares[1])) == 1000


def flaky_block(start: int, count: int, marker: str) -> np.ndarray:
    """Rows ``start..start+count``; the first two computations of partition 0 find its storage
    out of reach (as S3 restarting), counted in a file (they run in worker processes)."""
    if start == 0:
        tries = Path(marker)
        done = int(tries.read_text()) if tries.exists() else 0
        tries.write_text(str(done + 1))
        if done < 2:
            raise ConnectionRefusedError(111, "Connection refused (the storage restarts)")
    return np.arange(start, start + count)


def read_once(config: dict[str, Any]) -> None:
    ids = [
        int(i)
        for b in trainlib.get_dataset_shard("train").iter_batches(batch_size=50)
        for i in b["id"]
    ]
    trainlib.report({"ids": ids})


def test_ingest_a_partition_whose_storage_is_out_of_reach_is_computed_again(
    dask_client: Client, tmp_path: Path
) -> None:
    marker = str(tmp_path / "tries")
    parts = [
        da.from_delayed(dask.delayed(flaky_block)(s, 100, marker), (100,), dtype=np.int64)
        for s in (0, 100, 200, 300)
    ]
    result = TorchTrainer(
        read_once,
        datasets={"train": {"id": da.concatenate(parts)}},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs")),
        client=dask_client,
    ).fit()
    assert int(Path(marker).read_text()) == 3  # failed twice, then computed
    assert len(result.metrics["ids"]) == 200  # rank 0's share, every row
