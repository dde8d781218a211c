"""The sweep-storage flow: what ended runs left in the runs' storage, removed on a schedule of
its own (not only after a publish, so nights that never publish are swept too, and a failure
alerts as any run's does)."""

from __future__ import annotations

from prefect import flow

from flows.run_policy import run_policy
from flows.time_limit import time_limit
from tasks.layout import StorageLayout
from tasks.retention import sweep_storage_task


@flow(name="sweep-storage", persist_result=True)  # see flows/__init__.py
def sweep_storage(
    storage_path: str | None = None, timeout_minutes: float | None = 60.0
) -> dict[str, int]:
    """Sweep the runs' storage: in the run directories of ended flow runs, delete what no
    checkpoint commit made, and whole directories older than the retention
    (``$CIFAR_RETENTION_DAYS``, default 90).

    Args:
        storage_path: The pipeline's storage (default $CIFAR_STORAGE_PATH, as train-cifar's);
            a worker's run policy confines it.
        timeout_minutes: A longer run fails (None: no limit).

    Returns:
        How many uncommitted checkpoint directories and expired runs were removed.
    """
    with time_limit(timeout_minutes, "sweep-storage"):
        run_policy().confine(storage_path=storage_path)
        swept = sweep_storage_task(StorageLayout.at(storage_path).runs)
        return {"uncommitted": len(swept.uncommitted), "expired": len(swept.expired)}
