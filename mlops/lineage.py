"""Dataset lineage in MLflow: which archive and which split trained a run.

Each training run (each trial of a search) logs its train and validation splits with
``log_inputs``: MLflow datasets whose source is the archive's URL and whose digest is the
split's fingerprint from the dataset manifest (``Manifest.digest``), so the MLflow UI lists
them under "Datasets used" on the run, and on a registered version's source run. Each
evaluation is a run of its own, nested under the training run, with the test split (context
``test``) and the model it evaluated as its inputs, its metrics linked to both: a training run
never lists the test split. The version itself carries the digest of the whole dataset as the tag
``data_digest``.
"""

from __future__ import annotations

import warnings

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.http_dataset_source import HTTPDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Dataset as MlflowDataset
from mlflow.entities import DatasetInput, InputTag, LoggedModelInput
from mlflow.tracking import MlflowClient

from cifar.dataset import Dataset

DIGEST_TAG = "data_digest"
SYNTHETIC_TAG = "synthetic_data"
SPLITS = ("train", "val")
_CONTEXT = {"train": "training", "val": "validation", "test": "test"}
_CONTEXT_TAG = "mlflow.data.context"


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


def _entity(dataset: MetaDataset) -> MlflowDataset:
    """The run input's record of ``dataset``, from its public ``to_dict``."""
    found = dataset.to_dict()
    return MlflowDataset(
        found["name"], found["digest"], found["source_type"], found["source"], found.get("schema")
    )


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
                _entity(mlflow_dataset),
                tags=[InputTag(_CONTEXT_TAG, _CONTEXT[split])],
            )
        )
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    client.set_tag(run_id, DIGEST_TAG, dataset.manifest.digest())
    client.set_tag(run_id, SYNTHETIC_TAG, str(dataset.manifest.synthetic).lower())


def log_test_input(
    tracking_uri: str,
    run_id: str,
    dataset: Dataset,
    model_id: str | None,
    source_run_id: str | None = None,
) -> str:
    """Log the test split as an input of the evaluation run ``run_id`` (context ``test``), with
    the LoggedModel ``model_id`` it evaluated; return the MLflow dataset's name. Its source is
    the one the training run ``source_run_id``'s splits name (the archive's URL), else the
    dataset's folder."""
    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    logged = run.inputs.dataset_inputs if run.inputs else []
    training = client.get_run(source_run_id) if source_run_id else None
    trained_on = training.inputs.dataset_inputs if training and training.inputs else []
    test = _entity(split_dataset(dataset, "test", dataset.uri))
    if trained_on:  # the same archive: its source as the training splits recorded it
        first = trained_on[0].dataset
        test = MlflowDataset(test.name, test.digest, first.source_type, first.source)
    if not any((d.dataset.name, d.dataset.digest) == (test.name, test.digest) for d in logged):
        client.log_inputs(
            run_id,
            datasets=[DatasetInput(test, tags=[InputTag(_CONTEXT_TAG, _CONTEXT["test"])])],
            models=[LoggedModelInput(model_id)] if model_id else None,
        )
    return test.name
