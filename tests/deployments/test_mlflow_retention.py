"""MLflow's retention on a real store: withdrawn versions and runs no version comes from are
deleted and purged; a version in use (or holding an alias) and its run stay, whatever their age;
every search read to its last page."""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from deployments.mlflow_retention import expire, purge
from mlops.version_tags import WITHDRAWN_TAG


def test_mlflow_retention_deletes_what_no_version_in_use_needs(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("train-cifar", artifact_location=str(tmp_path / "a"))
    old = int((time.time() - 200 * 86400) * 1000)
    runs = {}
    for name in ("kept", "withdrawn", "plain", "recent", "aliased"):
        runs[name] = client.create_run(experiment, run_name=name).info.run_id
        client.set_terminated(runs[name], end_time=None if name == "recent" else old)
    client.create_registered_model("m")
    kept = client.create_model_version("m", "runs:/x/model", run_id=runs["kept"]).version
    gone = client.create_model_version("m", "runs:/y/model", run_id=runs["withdrawn"]).version
    client.set_model_version_tag("m", gone, WITHDRAWN_TAG, "rolled back")
    # withdrawn while it holds an alias (by someone who may tag): kept, with its run
    aliased = client.create_model_version("m", "runs:/z/model", run_id=runs["aliased"]).version
    client.set_registered_model_alias("m", "champion", aliased)
    client.set_model_version_tag("m", aliased, WITHDRAWN_TAG, "a user's tag")
    cutoff = int((time.time() - 90 * 86400) * 1000) + 10**12
    deleted = expire(client, cutoff_ms=cutoff, page_size=2)  # pages of 2: read to the end
    assert deleted.versions == (("m", str(gone)),)
    # every run ended before the cutoff (it is in the future here) but the one a version needs
    assert sorted(deleted.runs) == sorted(runs[n] for n in ("withdrawn", "plain", "recent"))
    purge(uri, uri)
    left = client.search_runs([experiment], run_view_type=ViewType.ALL)
    assert sorted(r.info.run_id for r in left) == sorted([runs["kept"], runs["aliased"]])
    assert sorted(v.version for v in client.search_model_versions("name='m'")) == sorted(
        [kept, aliased]
    )
