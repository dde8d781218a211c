"""Dataset lineage in MLflow: which archive and which split trained a run.

Each training run (each trial of a search) logs its train and validation splits with
``log_inputs``: MLflow datasets whose source is the archive's URL and whose digest is the
split's fingerprint from the dataset manifest (``Manifest.digest``), so the MLflow UI lists
them under "Datasets used" on the run, and on a registered version's source run. The version
itself carries the digest of the whole dataset as the tag ``data_digest``.
"""

from __future__ import annotations

import warnings

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.http_dataset_source import HTTPDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag
from mlflow.tracking import MlflowClient

from cifar.dataset import Dataset

DIGEST_TAG = "data_digest"
SYNTHETIC_TAG = "synthetic_data"
SPLITS = ("train", "val")
_CONTEXT = {"train": "training", "val": "validation", "test": "evaluation"}


def _source(url: str) -> DatasetSource:
    """The MLflow source of an archive URL: https, s3, a file."""
    if url.startswith(("http://", "https://")):
        return HTTPDatasetSource(url)
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": all are equal here
        warnings.simplefilter("ignore", UserWarning)
        return resolve_dataset_source(url)


def split_dataset(dataset: Dataset, split: str, source_url: str) -> MetaDataset:
    """The split as an MLflow dataset: named after the dataset and split, digest from the
    manifest, source the archive's URL."""
    name = f"{dataset.uri.rstrip('/').rsplit('/', 1)[-1]}/{split}"
    digest = dataset.manifest.digest(split)
    return MetaDataset(_source(source_url), name=name, digest=digest)  # type: ignore[abstract]


def log_dataset_inputs(
    tracking_uri: str, run_id: str, dataset: Dataset, source_url: str | None
) -> None:
    """Log the train and validation splits as the run's inputs (once: a resumed run that has
    them already logs nothing), and tag the run with the dataset's digest."""
    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    source = source_url or dataset.uri
    already = run.inputs.dataset_inputs if run.inputs else []
    logged = {(d.dataset.name, d.dataset.digest) for d in already}
    inputs = []
    for split in SPLITS:
        mlflow_dataset = split_dataset(dataset, split, source)
        if (mlflow_dataset.name, mlflow_dataset.digest) in logged:
            continue
        inputs.append(
            DatasetInput(
                mlflow_dataset._to_mlflow_entity(),
                tags=[InputTag("mlflow.data.context", _CONTEXT[split])],
            )
        )
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    client.set_tag(run_id, DIGEST_TAG, dataset.manifest.digest())
    client.set_tag(run_id, SYNTHETIC_TAG, str(dataset.manifest.synthetic).lower())
