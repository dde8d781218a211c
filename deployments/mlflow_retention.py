"""MLflow's retention: runs and withdrawn versions older than the retention are deleted, then
purged with their artifacts (``mlflow gc``). The stack's ``mlflow-maintenance`` service runs it
once a day (``--every-h``), as MLflow's admin.

    python -m deployments.mlflow_retention --days 90 [--every-h 24]

Deleted: each withdrawn model version (a publish that failed, a duplicate, a sweep) whose last
change is older than ``--days``; then each finished run of the pipeline's experiments
(``train-cifar``, ``tune-cifar``) that ended before that and is not the source of a version still
in the registry. ``mlflow gc`` then purges the deleted runs, their metrics and artifacts
(``$MLFLOW_BACKEND_STORE_URI``; artifacts through ``$MLFLOW_TRACKING_URI``, the server that
proxies them). A version that holds an alias (withdrawn or not), or is not withdrawn, and its
run, are kept whatever their age: the registry is the model's record. Searches are read to
their last page.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mlflow.tracking import MlflowClient

from mlops.version_tags import WITHDRAWN_TAG

logger = logging.getLogger("deployments.mlflow_retention")
EXPERIMENTS = ("train-cifar", "tune-cifar")


@dataclass(frozen=True)
class Deleted:
    versions: tuple[tuple[str, str], ...]  # (model, version)
    runs: tuple[str, ...]


def expire(
    client: MlflowClient,
    cutoff_ms: int,
    experiments: tuple[str, ...] = EXPERIMENTS,
    page_size: int = 1000,
) -> Deleted:
    """Delete withdrawn versions last changed before ``cutoff_ms`` that hold no alias, then the
    runs of ``experiments`` that ended before it and no remaining version comes from. Every
    search is read page by page (``page_size`` at a time), not its first page alone."""
    versions = []
    kept_runs: set[str] = set()
    for model in _pages(client.search_registered_models, max_results=page_size):
        held = {str(v) for v in (client.get_registered_model(model.name).aliases or {}).values()}
        search = f"name='{model.name}'"
        # read to the end before deleting: the pages are offsets, a deletion shifts them
        for version in list(_pages(client.search_model_versions, search, max_results=page_size)):
            withdrawn = WITHDRAWN_TAG in (version.tags or {})
            old = (version.last_updated_timestamp or 0) < cutoff_ms
            if withdrawn and old and str(version.version) not in held:
                client.delete_model_version(model.name, version.version)
                versions.append((model.name, str(version.version)))
            elif version.run_id:
                kept_runs.add(version.run_id)
    runs = []
    ids = [e.experiment_id for name in experiments if (e := client.get_experiment_by_name(name))]
    if ids:
        ended_runs = _pages(
            client.search_runs,
            ids,
            filter_string="attributes.status != 'RUNNING'",
            max_results=page_size,
        )
        for run in list(ended_runs):  # read to the end before deleting, as above
            ended = run.info.end_time or run.info.start_time or 0
            if ended < cutoff_ms and run.info.run_id not in kept_runs:
                client.delete_run(run.info.run_id)
                runs.append(run.info.run_id)
    return Deleted(tuple(versions), tuple(runs))


def _pages(search: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
    """Every result of an MLflow search, page after page (its ``token``)."""
    token = None
    while True:
        page = search(*args, **kwargs, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def purge(backend_store_uri: str, tracking_uri: str) -> None:
    """``mlflow gc``: purge every deleted run (its metadata from the store, its artifacts through
    the tracking server, which proxies them)."""
    subprocess.run(
        [sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", backend_store_uri],
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri},
        check=True,
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--days", type=float, default=float(os.environ.get("CIFAR_RETENTION_DAYS", "90"))
    )
    parser.add_argument("--every-h", type=float, default=None, help="repeat (default: once)")
    args = parser.parse_args(argv)
    while True:
        cutoff = int((time.time() - args.days * 86400) * 1000)
        client = MlflowClient()
        deleted = expire(client, cutoff)
        logger.info(
            "Retention %g days: %d withdrawn versions and %d runs deleted",
            args.days,
            len(deleted.versions),
            len(deleted.runs),
        )
        purge(os.environ["MLFLOW_BACKEND_STORE_URI"], client.tracking_uri)
        if args.every_h is None:
            return
        time.sleep(args.every_h * 3600)


if __name__ == "__main__":
    main()
