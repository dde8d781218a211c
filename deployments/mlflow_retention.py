"""MLflow's retention: runs, versions and logged models older than the retention are deleted,
then purged with their artifacts (``mlflow gc``). The stack's ``mlflow-maintenance`` service runs
it once a day (``--every-h``), as MLflow's admin.

    python -m deployments.mlflow_retention --days 90 --keep-versions 10 [--every-h 24]

Deleted, for each registered model: each version whose last change is older than ``--days``
(``CIFAR_RETENTION_DAYS``), that holds no alias, and that is either withdrawn (a publish that
failed, a duplicate, a sweep) or a settled publication (its promotion decision recorded) older
than the model's newest ``--keep-versions`` (``CIFAR_KEEP_VERSIONS``) that were not withdrawn;
with it, its logged model. A version that holds an alias, one of the newest kept, one still
being published (no decision, not withdrawn), or a recent one stays, with its run and logged
model. Then each finished run of the pipeline's experiments (``train-cifar``, ``tune-cifar``)
that ended before the retention and is not the source of a remaining version, and each logged
model of those experiments older than the retention that no remaining version is made from (a
publish that failed before its version was made). The promotion ledger (the registered model's
tags) is never touched: a deleted version's comparison still counts against the model's alpha.
``mlflow gc`` then purges the deleted runs and logged models with their metrics and artifacts
(``$MLFLOW_BACKEND_STORE_URI``; artifacts through ``$MLFLOW_TRACKING_URI``, the server that
proxies them). Searches are read to their last page, so nothing old escapes after years.
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

from mlops.version_tags import PROMOTION_TAG, WITHDRAWN_TAG, logged_model_of

logger = logging.getLogger("deployments.mlflow_retention")
EXPERIMENTS = ("train-cifar", "tune-cifar")
KEEP_VERSIONS = 10  # the newest publications of each model kept whatever their age


@dataclass(frozen=True)
class Deleted:
    versions: tuple[tuple[str, str], ...]  # (model, version)
    runs: tuple[str, ...]
    logged_models: tuple[str, ...]


def expire(
    client: MlflowClient,
    cutoff_ms: int,
    experiments: tuple[str, ...] = EXPERIMENTS,
    page_size: int = 1000,
    keep_versions: int = KEEP_VERSIONS,
) -> Deleted:
    """Delete what the module doc says: versions, then runs, then logged models, each older
    than ``cutoff_ms``. Every search is read page by page (``page_size`` at a time) to its end
    before anything is deleted (the pages are offsets: a deletion shifts them)."""
    versions, gone_models = [], []
    kept_runs: set[str] = set()
    kept_models: set[str] = set()
    for model in list(_pages(client.search_registered_models, max_results=page_size)):
        held = {str(v) for v in (client.get_registered_model(model.name).aliases or {}).values()}
        search = f"name='{model.name}'"
        found = list(_pages(client.search_model_versions, search, max_results=page_size))
        found.sort(key=lambda v: int(v.version), reverse=True)
        published = [v for v in found if WITHDRAWN_TAG not in (v.tags or {})]
        newest = {str(v.version) for v in published[:keep_versions]}
        for version in found:
            if _expired(version, cutoff_ms, held | newest):
                client.delete_model_version(model.name, version.version)
                versions.append((model.name, str(version.version)))
                if model_id := logged_model_of(version):
                    client.delete_logged_model(model_id)
                    gone_models.append(model_id)
                continue
            if version.run_id:
                kept_runs.add(version.run_id)
            if model_id := logged_model_of(version):
                kept_models.add(model_id)
    runs = []
    ids = [e.experiment_id for name in experiments if (e := client.get_experiment_by_name(name))]
    if ids:
        ended_runs = _pages(
            client.search_runs,
            ids,
            filter_string="attributes.status != 'RUNNING'",
            max_results=page_size,
        )
        for run in list(ended_runs):
            ended = run.info.end_time or run.info.start_time or 0
            if ended < cutoff_ms and run.info.run_id not in kept_runs:
                client.delete_run(run.info.run_id)
                runs.append(run.info.run_id)
        logged = list(_pages(client.search_logged_models, ids, max_results=page_size))
        for made in logged:
            orphan = made.model_id not in kept_models and made.model_id not in gone_models
            if orphan and (made.creation_timestamp or 0) < cutoff_ms:
                client.delete_logged_model(made.model_id)
                gone_models.append(made.model_id)
    return Deleted(tuple(versions), tuple(runs), tuple(gone_models))


def _expired(version: Any, cutoff_ms: int, kept: set[str]) -> bool:
    """Whether retention deletes ``version`` (module doc); ``kept``: the versions holding an
    alias and the model's newest publications."""
    tags = version.tags or {}
    old = (version.last_updated_timestamp or 0) < cutoff_ms
    decided = WITHDRAWN_TAG in tags or PROMOTION_TAG in tags  # never one still being published
    return old and decided and str(version.version) not in kept


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
    parser.add_argument(
        "--keep-versions",
        type=int,
        default=int(os.environ.get("CIFAR_KEEP_VERSIONS", str(KEEP_VERSIONS))),
        help="the newest publications of each model kept whatever their age",
    )
    parser.add_argument("--every-h", type=float, default=None, help="repeat (default: once)")
    args = parser.parse_args(argv)
    if args.keep_versions < 0:
        parser.error(f"--keep-versions {args.keep_versions}: give 0 or more versions to keep")
    while True:
        cutoff = int((time.time() - args.days * 86400) * 1000)
        client = MlflowClient()
        deleted = expire(client, cutoff, keep_versions=args.keep_versions)
        logger.info(
            "Retention %g days, newest %d versions kept: %d versions, %d runs and %d logged "
            "models deleted",
            args.days,
            args.keep_versions,
            len(deleted.versions),
            len(deleted.runs),
            len(deleted.logged_models),
        )
        purge(os.environ["MLFLOW_BACKEND_STORE_URI"], client.tracking_uri)
        if args.every_h is None:
            return
        time.sleep(args.every_h * 3600)


if __name__ == "__main__":
    main()
