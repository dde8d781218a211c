"""The head train-cifar and tune-cifar share: the storage layout, the MLflow store, the archive,
the Dask cluster and the dataset prepared on it, ready to train."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cifar.dataset import Dataset
from flows.redirects import final_url
from flows.run_policy import RunPolicy
from mlops.tracking import resolve_tracking_uri
from tasks.download import Archive, expected_md5, fetch_archive
from tasks.layout import StorageLayout
from tasks.preprocess import prepare_dataset
from tasks.tracking import prepare_experiment_task
from trainlib import DaskConfig


@dataclass(frozen=True)
class Prepared:
    """What the flow's training step starts from."""

    layout: StorageLayout
    tracking_uri: str
    archive: Archive
    dataset: Dataset
    dask_config: DaskConfig  # attached to the flow's cluster: training runs where the data is


@contextmanager
def prepared(
    data_url: str,
    data_md5: str | None,
    storage_path: str | None,
    mlflow_tracking_uri: str | None,
    experiment: str,
    dask_config: DaskConfig,
    cluster_workers: int,
    ranks: int,
    batch_size: int,
    rows_per_file: int,
    policy: RunPolicy,
) -> Iterator[Prepared]:
    """Download and verify the archive, start (or connect to) the Dask cluster with
    ``cluster_workers`` workers before any work is done, and preprocess the archive on it for
    ``ranks`` ranks of ``batch_size``. The MLflow experiment is prepared meanwhile. The cluster
    stays up while the block runs. The archive is read from where ``data_url``'s redirects
    lead, each checked against ``policy``."""
    layout = StorageLayout.at(storage_path)
    tracking_uri = resolve_tracking_uri(mlflow_tracking_uri)
    tracking = prepare_experiment_task.submit(tracking_uri, experiment)  # while data is prepared
    source = final_url("data_url", data_url, policy)
    archive = fetch_archive(source, layout, expected_md5(data_url, data_md5))
    # The rank processes start (import torch) while the data is prepared.
    with dask_config.connect(num_workers=cluster_workers, wait=True, warm_ranks=True) as client:
        attached = dask_config.attached_to(client)
        dataset = prepare_dataset(
            archive,
            layout,
            dask_config=attached,
            num_workers=ranks,
            batch_size=batch_size,
            rows_per_file=rows_per_file,
        )
        tracking.result()
        yield Prepared(layout, tracking_uri, archive, dataset, attached)
