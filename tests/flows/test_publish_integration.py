"""publish(): register → evaluate → promote as one Prefect transaction, on a real Prefect server
and MLflow store, with an untrained model (no training needed to publish)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from prefect import flow

from cifar.checkpoint import load_classifier
from cifar.dataset import Dataset, Manifest, content_digest, write_file, write_manifest
from cifar.format import CLASS_NAMES
from flows.publish import PublishError, publish
from mlops.evaluation import score
from mlops.promotion import PromotionRule
from mlops.registry import model_name_for, register_model
from mlops.tracking import start_run
from mlops.version_tags import WITHDRAWN_TAG
from tasks.download import Archive
from tasks.train import TrainedRun
from tests.lossy_proxy import lossy_proxy
from tests.mlflow_rig import mlflow_server
from tests.mlops.test_promotion import untrained_model, write_checkpoint
from tests.prefect_records import task_runs


@flow(name="publish-test")
def publish_flow(
    trained: TrainedRun, dataset: Dataset, model_name: str | None, fresh_tracking_uri: str
) -> dict[str, Any]:
    archive = Archive("file:///synthetic.tar.gz", "md5", verified=True)
    name = model_name_for(model_name, dataset.manifest.synthetic)
    return publish(trained, archive, dataset, name, PromotionRule(), fresh_tracking_uri)


def _recognisable(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """20 test images labelled as ``untrained_model()`` classifies them, 10 in each of its two
    most frequent answers: the checkpoints published here beat chance (a first version must)."""
    colours = rng.integers(0, 256, (400, 3, 1, 1), dtype=np.uint8)  # plain: varied answers
    pool = np.ascontiguousarray(np.broadcast_to(colours, (400, 3, 32, 32)))
    answers = score(untrained_model(), pool).argmax(1)
    two = np.argsort(np.bincount(answers, minlength=10))[-2:]
    chosen = np.concatenate([np.flatnonzero(answers == label)[:10] for label in two])
    assert len(chosen) == 20, "the untrained model answers fewer than two classes 10 times"
    return pool[chosen], answers[chosen]


def _dataset(root: Path, synthetic: bool) -> Dataset:
    rng = np.random.default_rng(0)
    splits, contents = {}, {}
    for split in ("train", "val", "test"):
        images = rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
        labels = np.arange(20) % 10
        if split == "test":
            images, labels = _recognisable(rng)
        splits[split] = [write_file(str(root / f"{split}-00000.parquet"), images, labels)]
        contents[split] = content_digest(images, labels)
    manifest = Manifest(
        "md5", True, CLASS_NAMES, (0.5,) * 3, (0.25,) * 3, 0.1, 0, splits, synthetic, contents
    )
    write_manifest(str(root), manifest)
    return Dataset(str(root), manifest)


def _trained(tmp_path: Path, fresh_tracking_uri: str, name: str) -> TrainedRun:
    run_id = start_run(fresh_tracking_uri, "publish-test", name, {}, {})
    checkpoint = write_checkpoint(tmp_path / name)
    return TrainedRun(run_id, checkpoint, {}, {}, str(tmp_path))


def test_publish_synthetic_data_gets_its_own_model_name(
    prefect_server: None, tmp_path: Path, fresh_tracking_uri: str
) -> None:
    dataset = _dataset(tmp_path / "data", synthetic=True)
    summary = publish_flow(
        _trained(tmp_path, fresh_tracking_uri, "a"), dataset, None, fresh_tracking_uri
    )
    assert (summary["model_name"], summary["alias"], summary["synthetic_data"]) == (
        "cifar10-classifier-synthetic",
        "champion",
        True,
    )
    assert (
        MlflowClient(fresh_tracking_uri).search_registered_models("name = 'cifar10-classifier'")
        == []
    )


def _usable(client: MlflowClient, name: str) -> list[str]:
    """The versions of ``name`` not withdrawn."""
    found = client.search_model_versions(f"name = '{name}'")
    return sorted(str(v.version) for v in found if WITHDRAWN_TAG not in v.tags)


def test_publish_failed_evaluation_withdraws_the_version(
    prefect_server: None, tmp_path: Path, fresh_tracking_uri: str
) -> None:
    dataset = _dataset(tmp_path / "data", synthetic=False)
    first = publish_flow(
        _trained(tmp_path, fresh_tracking_uri, "a"), dataset, "txn", fresh_tracking_uri
    )
    assert (first["model_version"], first["alias"]) == ("1", "champion")
    broken_dir = tmp_path / "broken"
    shutil.copytree(dataset.uri, broken_dir)
    (broken_dir / "test-00000.parquet").write_bytes(b"not the file the manifest describes")
    broken = Dataset(str(broken_dir), dataset.manifest)
    with pytest.raises(PublishError, match="version 2 was withdrawn"):
        publish_flow(_trained(tmp_path, fresh_tracking_uri, "b"), broken, "txn", fresh_tracking_uri)
    client = MlflowClient(fresh_tracking_uri)
    assert _usable(client, "txn") == ["1"]
    assert client.get_model_version("txn", "2").tags[WITHDRAWN_TAG] == (
        "publishing it failed; rolled back"
    )
    aliases = client.get_registered_model("txn").aliases
    assert {alias: str(version) for alias, version in aliases.items()} == {"champion": "1"}


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as url:
        yield url


@pytest.mark.parametrize(
    ("mlflow_retries", "creates", "register_runs"),
    [
        ("7", 2, 1),  # MLflow's default: its client sends the create again itself
        ("0", 1, 2),  # the register task fails; Prefect's retry finds the version
    ],
)
def test_publish_a_lost_registry_reply_during_register_leaves_one_version(
    prefect_server: None,
    tmp_path: Path,
    mlflow_url: str,
    mlflow_retries: str,
    creates: int,
    register_runs: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry creates the version and its reply is lost (network, load balancer): the
    retry, MLflow's own or Prefect's, ends with that version; the registry holds one."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", mlflow_retries)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    name = f"outage-{mlflow_retries}"
    dataset = _dataset(tmp_path / "data", synthetic=False)
    with lossy_proxy(mlflow_url, "/model-versions/create") as (proxied, proxy):
        state = publish_flow(
            _trained(tmp_path, proxied, name), dataset, name, proxied, return_state=True
        )
        summary = state.result()
    assert proxy.seen == creates
    register = task_runs(state.state_details.flow_run_id, ["register"])["register"]
    assert register.run_count == register_runs
    client = MlflowClient(mlflow_url)
    assert _usable(client, name) == ["1"]
    assert (summary["model_version"], summary["alias"]) == ("1", "champion")
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"


def test_publish_withdraws_the_version_of_a_publish_that_never_finished(
    prefect_server: None, tmp_path: Path, fresh_tracking_uri: str
) -> None:
    """A publish killed between register and promote (its process gone, no rollback) left a
    version with no alias and no decision; the next publish withdraws it, once."""
    dataset = _dataset(tmp_path / "data", synthetic=False)
    trained = _trained(tmp_path, fresh_tracking_uri, "killed")
    classifier = load_classifier(trained.best_checkpoint_uri)
    gone = str(uuid.uuid4())  # the killed publish's flow run: no server knows it now
    left = register_model(classifier, trained.run_id, "swept", fresh_tracking_uri, request_id=gone)
    summary = publish_flow(
        _trained(tmp_path, fresh_tracking_uri, "next"), dataset, "swept", fresh_tracking_uri
    )
    client = MlflowClient(fresh_tracking_uri)
    reason = client.get_model_version("swept", left).tags[WITHDRAWN_TAG]
    assert reason == f"left by a publish that never finished (flow run {gone})"
    assert _usable(client, "swept") == [summary["model_version"]]
    assert summary["alias"] == "champion"
    publish_flow(
        _trained(tmp_path, fresh_tracking_uri, "again"), dataset, "swept", fresh_tracking_uri
    )
    assert client.get_model_version("swept", left).tags[WITHDRAWN_TAG] == reason  # idempotent
