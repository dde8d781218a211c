"""The registering tasks: a trained checkpoint becomes a new version of the registered model,
once per flow run whatever the retries, and a rollback of the publishing transaction withdraws
it; before that, the versions of publishes that never finished are withdrawn (a sweep)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.transactions import Transaction, get_transaction

from cifar.dataset import Dataset
from mlops.publish_queue import wait_for_turn
from mlops.registry import register_checkpoint, withdraw_unfinished, withdraw_version
from tasks.flow_runs import ended
from tasks.retrying import TRANSIENT_RETRIES


@task(name="register", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def register_task(
    checkpoint_uri: str, run_id: str, model_name: str, tracking_uri: str, dataset: Dataset
) -> str:
    """Register, once per flow run whatever the retries; in a transaction, a rollback withdraws
    the version again."""
    request_id = flow_run.get_id()
    version = register_checkpoint(
        checkpoint_uri, run_id, model_name, tracking_uri, dataset, request_id
    )
    if (txn := get_transaction()) is not None:
        txn.set("registered", (model_name, version, tracking_uri))
    return version


@register_task.on_rollback
def _withdraw_registered(txn: Transaction) -> None:
    model_name, version, tracking_uri = txn.get("registered")
    withdraw_version(model_name, version, tracking_uri, "publishing it failed; rolled back")


@task(name="sweep-unfinished", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def sweep_task(model_name: str, tracking_uri: str) -> list[str]:
    """Withdraw the versions of publishes that never finished (``withdraw_unfinished``)."""
    return withdraw_unfinished(model_name, tracking_uri, lambda run: not ended(run))


@task(name="wait-for-earlier-publishes", cache_policy=NO_CACHE)
def publish_queue_task(model_name: str, version: str, tracking_uri: str) -> None:
    """Wait until every earlier version of the model has finished publishing (one publication
    at a time per model, in version order: ``mlops.publish_queue``); Prefect unreachable, wait."""
    wait_for_turn(model_name, version, tracking_uri, flow_run.get_id(), lambda run: not ended(run))
