"""The registering task: a trained checkpoint becomes a new version of the registered model,
once per flow run whatever the retries; a rollback of the publishing transaction removes it."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.transactions import Transaction, get_transaction

from cifar.dataset import Dataset
from mlops.registry import register_checkpoint, remove_version
from tasks.retrying import TRANSIENT_RETRIES


@task(name="register", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def register_task(
    checkpoint_uri: str, run_id: str, model_name: str, tracking_uri: str, dataset: Dataset
) -> str:
    """Register, once per flow run whatever the retries; in a transaction, a rollback removes
    the version again."""
    request_id = flow_run.get_id()
    version = register_checkpoint(
        checkpoint_uri, run_id, model_name, tracking_uri, dataset, request_id
    )
    if (txn := get_transaction()) is not None:
        txn.set("registered", (model_name, version, tracking_uri))
    return version


@register_task.on_rollback
def _remove_registered(txn: Transaction) -> None:
    model_name, version, tracking_uri = txn.get("registered")
    remove_version(model_name, version, tracking_uri, "publishing it failed; rolled back")
