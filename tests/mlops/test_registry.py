"""The model registry on a real MLflow sqlite store, with the URI given explicitly."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from cifar.classifier_file import CLASSIFIER_FILE, save_classifier
from cifar.models import build_model
from mlops.alias_moves import promote
from mlops.evaluation import Evaluation
from mlops.model_loading import (
    ModelIntegrityError,
    ModelNotFoundError,
    load_model,
    load_version,
    scores_in_fresh_process,
)
from mlops.promotion import PromotionRule
from mlops.registry import (
    REQUIREMENTS,
    file_digest,
    logged_model_id,
    model_name_for,
    register_model,
    using_store,
)
from mlops.tracking import start_run
from mlops.version_tags import WEIGHTS_TAG, WITHDRAWN_TAG


def _register(tracking_uri: str, name: str, accuracy: float | None = None) -> str:
    run_id = start_run(tracking_uri, "registry-test", "run", {"lr": 0.1}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    version = register_model(model, run_id, name, tracking_uri)
    if accuracy is not None:
        MlflowClient(tracking_uri).set_model_version_tag(
            name, version, "test_accuracy", str(accuracy)
        )
    return version


def test_registry_model_name_keeps_synthetic_apart() -> None:
    assert model_name_for(None, synthetic=False) == "cifar10-classifier"
    assert model_name_for(None, synthetic=True) == "cifar10-classifier-synthetic"
    assert model_name_for("mine", synthetic=True) == "mine"


def test_registry_missing_alias_names_the_fix(tracking_uri: str) -> None:
    _register(tracking_uri, "lonely")
    with pytest.raises(ModelNotFoundError, match="'lonely' has no version with alias @nope"):
        load_model("lonely", "nope", tracking_uri)
    with pytest.raises(ModelNotFoundError, match="'ghost' has no version"):
        load_model("ghost", "champion", tracking_uri)


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_registry_model_loads_in_a_fresh_process(tracking_uri: str, tmp_path: Path) -> None:
    correct = np.ones(40, bool)  # 4 images of each class, all right: better than chance
    evaluation = Evaluation(1.0, {}, (np.eye(10, dtype=int) * 4).tolist(), 40, correct)
    promote(
        "fresh", _register(tracking_uri, "fresh", 0.5), evaluation, PromotionRule(), tracking_uri
    )
    code = (
        "import json, numpy as np, mlflow.pyfunc\n"
        "x = np.arange(3 * 3 * 32 * 32, dtype=np.int64).reshape(3, 3, 32, 32) % 256\n"
        "out = mlflow.pyfunc.load_model('models:/fresh@champion').predict(x.astype(np.uint8))\n"
        "print(json.dumps(np.asarray(out).tolist()))\n"
    )
    # as the stack's worker runs: MLflow may not unpickle anything
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    served = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    model, _ = load_model("fresh", "champion", tracking_uri)
    x = np.arange(3 * 3 * 32 * 32).reshape(3, 3, 32, 32) % 256
    with torch.no_grad():
        here = model(torch.from_numpy(x.astype(np.uint8))).numpy()
    np.testing.assert_allclose(served, here, rtol=1e-5, atol=1e-5)


def test_registry_a_retried_request_reuses_its_version(tracking_uri: str) -> None:
    """A retry of register (its first reply lost) gives the version the first attempt made;
    another request, or one whose version a rollback withdrew, registers a new one."""
    run_id = start_run(tracking_uri, "registry-test", "retried", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    first = register_model(model, run_id, "retried", tracking_uri, request_id="flow-run-1")
    again = register_model(model, run_id, "retried", tracking_uri, request_id="flow-run-1")
    other = register_model(model, run_id, "retried", tracking_uri, request_id="flow-run-2")
    client = MlflowClient(tracking_uri)
    assert again == first != other
    assert sorted(str(v.version) for v in client.search_model_versions("name='retried'")) == [
        "1",
        "2",
    ]
    client.set_model_version_tag("retried", first, WITHDRAWN_TAG, "rolled back")
    assert register_model(model, run_id, "retried", tracking_uri, request_id="flow-run-1") == "3"


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_registry_model_carries_its_code_so_a_process_without_the_project_loads_it(
    tracking_uri: str,
) -> None:
    """The fresh-load gate's process cannot import the project: a classifier logged without
    its code fails there, registered as the pipeline registers it (code_paths), it loads."""
    import mlflow.pytorch

    images = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    run_id = start_run(tracking_uri, "registry-test", "codeless", {}, {})
    with using_store(tracking_uri):
        logged = mlflow.pytorch.log_model(
            model,
            name="model",
            run_id=run_id,
            serialization_format="pickle",
            pip_requirements=list(REQUIREMENTS),
        )
        bare = str(mlflow.register_model(logged.model_uri, "codeless").version)
    with pytest.raises(RuntimeError, match="No module named 'cifar'"):
        scores_in_fresh_process("codeless", bare, tracking_uri, images)
    carried = register_model(model, run_id, "carried", tracking_uri)
    scores = scores_in_fresh_process("carried", carried, tracking_uri, images)
    assert scores.shape == (2, 10)


def _classifier_file(tracking_uri: str, name: str, version: str) -> Path:
    """Where the file store keeps ``version``'s classifier file (what an account that may edit
    artifacts could overwrite)."""
    client = MlflowClient(tracking_uri)
    model_id = logged_model_id(name, version, tracking_uri)
    assert model_id is not None
    location = client.get_logged_model(model_id).artifact_location
    return Path(location.removeprefix("file://")) / "artifacts" / CLASSIFIER_FILE


def test_registry_a_classifier_file_changed_after_publishing_is_never_loaded(
    tracking_uri: str,
) -> None:
    version = _register(tracking_uri, "tampered")
    other = build_model("small_cnn", (0.1,) * 3, (0.9,) * 3)
    save_classifier(str(_classifier_file(tracking_uri, "tampered", version)), other)
    with pytest.raises(ModelIntegrityError, match="changed after publishing"):
        load_version("tampered", version, tracking_uri)


class _Payload:
    """What a pickle may carry: code that runs when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.write_text, (self.marker, "ran"))


@pytest.mark.parametrize("forged_digest", [False, True])
def test_registry_a_version_this_pipeline_did_not_publish_runs_no_code(
    tracking_uri: str, tmp_path: Path, forged_digest: bool
) -> None:
    """Someone's version whose file is a pickle that runs code: without the publisher's digest
    it is refused unread; with a digest forged to match, torch's weights_only refuses it."""
    marker = tmp_path / "ran"
    version = _register(tracking_uri, "foreign")
    path = _classifier_file(tracking_uri, "foreign", version)
    torch.save({"model": _Payload(marker)}, path)  # torch.save pickles what it is given
    client = MlflowClient(tracking_uri)
    if forged_digest:
        client.set_model_version_tag("foreign", version, WEIGHTS_TAG, file_digest(str(path)))
    else:
        client.delete_model_version_tag("foreign", version, WEIGHTS_TAG)
    refused = (ModelIntegrityError, pickle.UnpicklingError)
    with pytest.raises(refused):
        load_version("foreign", version, tracking_uri)
    assert not marker.exists()


def test_registry_only_the_packages_classifiers_are_published(tracking_uri: str) -> None:
    run_id = start_run(tracking_uri, "registry-test", "local", {}, {})
    with pytest.raises(TypeError, match=r"takes a cifar\.models\.Classifier, not Linear"):
        register_model(torch.nn.Linear(2, 2), run_id, "local-code", tracking_uri)  # type: ignore[arg-type]
