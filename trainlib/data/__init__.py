"""Data ingest, as Ray Data's for Ray Train: Dask collections streamed into the ranks.

Pass ``TorchTrainer(datasets={"train": ds, ...}, dataset_config=DataConfig(...))``, where a
dataset is a ``trainlib.data.Dataset`` (Ray Data's: ``read_parquet``, ``from_items``, ``map``,
``map_batches``...), a ``dask.dataframe.DataFrame`` (e.g. ``dd.read_parquet(...)`` with
``map_partitions`` transforms) or a dict of Dask arrays with one entry per row. Inside the
training function, ``trainlib.get_dataset_shard("train").iter_torch_batches(batch_size=...)``
yields this rank's batches. Partitions are computed by Dask tasks on the cluster, next to the
rank that reads them where possible, and reach the rank while it trains.
"""

from trainlib.data.aggregate import AggregateFn
from trainlib.data.compute import ActorPoolStrategy
from trainlib.data.dataset import Dataset
from trainlib.data.grouped_data import GroupedData
from trainlib.data.iterator import DataIterator
from trainlib.data.read_api import (
    from_arrow,
    from_dask,
    from_items,
    from_numpy,
    from_pandas,
    from_torch,
    range,
    read_binary_files,
    read_csv,
    read_images,
    read_json,
    read_numpy,
    read_parquet,
    read_text,
)
from trainlib.data.schema import Schema
from trainlib.data.shard import get_dataset_shard
from trainlib.data_config import DataConfig
from trainlib.execution_options import ExecutionOptions, ExecutionResources

__all__ = [
    "ActorPoolStrategy",
    "AggregateFn",
    "DataConfig",
    "DataIterator",
    "Dataset",
    "ExecutionOptions",
    "ExecutionResources",
    "GroupedData",
    "Schema",
    "from_arrow",
    "from_dask",
    "from_items",
    "from_numpy",
    "from_pandas",
    "from_torch",
    "get_dataset_shard",
    "range",
    "read_binary_files",
    "read_csv",
    "read_images",
    "read_json",
    "read_numpy",
    "read_parquet",
    "read_text",
]
