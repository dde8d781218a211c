"""MLflow's retention on a real store: old withdrawn versions, old decided ones beyond the
newest kept, their logged models and runs no version comes from are deleted and purged; a
version holding an alias, one still being published, and its run stay, whatever their age;
every search read to its last page."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from deployments.mlflow_retention import expire, main, purge
from mlops.registry import using_store
from mlops.version_tags import PROMOTION_TAG, WITHDRAWN_TAG


@pytest.mark.integration  # starts a process (tests/process_guard.py)
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


def _after(ms: int) -> int:
    """The first millisecond of the clock after ``ms`` (what was made before is older)."""
    while (now := int(time.time() * 1000)) <= ms:
        pass
    return now


@pytest.mark.integration  # starts a process (tests/process_guard.py)
@pytest.mark.parametrize("seed", range(6))
def test_mlflow_retention_of_a_random_registry_keeps_the_aliased_the_newest_and_the_undecided(
    tmp_path: Path, seed: int
) -> None:
    """A registry made at random (versions withdrawn, decided, still publishing or holding an
    alias; old or recent; each from a logged model; logged models no version came from): what
    retention deletes is exactly what the rule says, with the versions' logged models, and
    ``mlflow gc`` purges those; the promotion ledger (the model's tags) is untouched."""
    rng = random.Random(seed)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("train-cifar", artifact_location=str(tmp_path / "a"))
    client.create_registered_model("m", tags={"ledger/split-1/1": "kept for good"})
    made: dict[str, tuple[str, bool, set[str]]] = {}  # version: (logged model, old, its marks)
    orphans: dict[str, bool] = {}  # logged model no version came from: old
    cutoff = 0
    for phase_is_old in (True, False):
        for _ in range(rng.randint(4, 9) if phase_is_old else rng.randint(0, 3)):
            model_id = client.create_logged_model(experiment).model_id
            marks = {m for m in ("withdrawn", "decided", "aliased") if rng.random() < 0.35}
            tags = {WITHDRAWN_TAG: "rolled back"} if "withdrawn" in marks else {}
            tags |= {PROMOTION_TAG: "@challenger: not better"} if "decided" in marks else {}
            with using_store(uri):  # MLflow resolves the source in the process-wide store
                version = client.create_model_version(
                    "m", f"models:/{model_id}", tags=tags, model_id=model_id
                ).version
            if "aliased" in marks:
                client.set_registered_model_alias("m", f"kept-{version}", version)
            made[str(version)] = (model_id, phase_is_old, marks)
        for _ in range(rng.randint(0, 2)):
            orphans[client.create_logged_model(experiment).model_id] = phase_is_old
        if phase_is_old:
            cutoff = _after(int(time.time() * 1000))
            _after(cutoff)
    keep = rng.randint(0, 6)  # seeds 0 and 5: the newest kept spare old decided versions
    newest = sorted((v for v, (_, _, m) in made.items() if "withdrawn" not in m), key=int)
    newest = newest[-keep:] if keep else []
    expected = {
        v
        for v, (_, old, marks) in made.items()
        if old and ({"withdrawn", "decided"} & marks) and "aliased" not in marks and v not in newest
    }
    deleted = expire(client, cutoff_ms=cutoff, page_size=3, keep_versions=keep)
    assert {v for _, v in deleted.versions} == expected
    old_orphans = {model_id for model_id, old in orphans.items() if old}
    assert set(deleted.logged_models) == {made[v][0] for v in expected} | old_orphans
    purge(uri, uri)
    left = {str(v.version) for v in client.search_model_versions("name='m'")}
    assert left == set(made) - expected
    for version, (model_id, _, _) in made.items():
        if version in left:
            assert client.get_logged_model(model_id).model_id == model_id
    for model_id in set(deleted.logged_models):
        with pytest.raises(MlflowException):
            client.get_logged_model(model_id)
    assert client.get_registered_model("m").tags == {"ledger/split-1/1": "kept for good"}


def test_mlflow_retention_refuses_a_negative_count_to_keep() -> None:
    with pytest.raises(SystemExit):
        main(["--keep-versions", "-1"])
