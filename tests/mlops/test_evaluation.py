"""Evaluation of a registered version: figures recorded in the store given, whatever the
process-wide MLflow setting says."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from cifar.dataset import Dataset, Manifest, content_digest, write_file, write_manifest
from cifar.format import CLASS_NAMES
from cifar.models import build_model
from mlops.evaluation import confusion_figure, evaluate_version, fresh_load_gate
from mlops.evidence import evidence_tag, read_evidence
from mlops.registry import logged_model_id, register_model
from mlops.release_gates import GateCannotRunError
from mlops.tracking import start_run
from tests.helpers import free_port


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/elsewhere.db")
    try:
        yield tmp_path / "elsewhere.db"
    finally:
        mlflow.set_tracking_uri(before)


def _test_split(root: Path) -> Dataset:
    images = np.random.default_rng(1).integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
    labels = np.arange(20) % 10
    files = [write_file(str(root / "test-00000.parquet"), images, labels)]
    manifest = Manifest(
        "md5",
        True,
        CLASS_NAMES,
        (0.5,) * 3,
        (0.25,) * 3,
        0.1,
        0,
        {"test": files},
        contents={"test": content_digest(images, labels)},
    )
    write_manifest(str(root), manifest)
    return Dataset(str(root), manifest)


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_evaluate_records_in_the_given_store(tmp_path: Path, elsewhere: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = start_run(uri, "evaluate-test", "run", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    version = register_model(model, run_id, "evaluated", uri)
    evaluation = evaluate_version("evaluated", version, _test_split(tmp_path / "data"), uri)
    assert evaluation.num_images == 20 and sum(map(sum, evaluation.confusion)) == 20
    client = MlflowClient(uri)
    evaluated = client.get_model_version("evaluated", version).tags["evaluation_run"]
    metrics = client.get_run(evaluated).data.metrics
    assert metrics["test_accuracy"] == evaluation.accuracy
    assert client.get_run(evaluated).data.tags["mlflow.parentRunId"] == run_id
    prefix = "test_accuracy_"
    per_class = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
    assert per_class == evaluation.per_class_accuracy and len(per_class) == 10
    tags = client.get_model_version("evaluated", version).tags
    assert float(tags["test_accuracy"]) == pytest.approx(evaluation.accuracy)
    stored = sorted(a.path for a in client.list_artifacts(evaluated, "evaluation"))
    test_digest = _test_split(tmp_path / "data").manifest.digest("test")
    assert stored == ["evaluation/confusion_matrix.png"]  # the evidence is the model's
    kept = read_evidence(client, "evaluated", version, test_digest)
    assert kept is not None and kept.dtype == bool and kept.mean() == evaluation.accuracy
    assert tags[evidence_tag(test_digest)] == hashlib.sha256(kept.tobytes()).hexdigest()
    assert evaluation.fresh_load is not None and evaluation.fresh_load.passed, evaluation
    assert not elsewhere.exists()
    assert mlflow.get_tracking_uri() == f"sqlite:///{elsewhere}"  # put back


def test_evaluate_links_its_metrics_to_the_logged_model_and_the_test_split(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = start_run(uri, "evaluate-test", "linked", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    version = register_model(model, run_id, "linked", uri)
    dataset = _test_split(tmp_path / "data")
    evaluation = evaluate_version("linked", version, dataset, uri, check_fresh_load=False)
    client = MlflowClient(uri)
    registered = client.get_model_version("linked", version)
    logged = client.get_logged_model(registered.source.removeprefix("models:/"))
    assert logged.source_run_id == run_id and registered.source == f"models:/{logged.model_id}"
    assert logged.experiment_id == client.get_run(run_id).info.experiment_id  # not Default's
    assert str(logged.status) in ("READY", "LoggedModelStatus.READY")
    training = client.get_run(run_id)
    assert [o.model_id for o in training.outputs.model_outputs] == [logged.model_id]
    assert not training.inputs.dataset_inputs  # never the test split: its own run has it
    run = client.get_run(registered.tags["evaluation_run"])
    (test_input,) = run.inputs.dataset_inputs
    assert test_input.dataset.digest == dataset.manifest.digest("test")
    assert [(t.key, t.value) for t in test_input.tags] == [("mlflow.data.context", "test")]
    assert [m.model_id for m in run.inputs.model_inputs] == [logged.model_id]
    linked = {m.key: m for m in logged.metrics or []}
    assert linked["test_accuracy"].value == evaluation.accuracy
    assert linked["test_accuracy"].dataset_digest == dataset.manifest.digest("test")
    assert linked["test_accuracy"].dataset_name == test_input.dataset.name


def _published(tmp_path: Path, name: str) -> tuple[str, str, Path]:
    """A version published as the pipeline publishes it: the store's URI, the version and the
    folder its model's files are kept in (what an account that may edit artifacts reaches)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = start_run(uri, "evaluate-test", "local", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    version = register_model(model, run_id, name, uri)
    model_id = logged_model_id(name, version, uri)
    assert model_id is not None
    location = MlflowClient(uri).get_logged_model(model_id).artifact_location
    return uri, version, Path(location.removeprefix("file://"))


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_evaluate_a_model_a_new_process_cannot_load_fails_the_fresh_load_gate(
    tmp_path: Path,
) -> None:
    """A version whose weights load here but whose served code fails (its pyfunc model file
    imports a module no service has): the gate scores it in a new process and fails."""
    uri, version, files = _published(tmp_path, "unservable")
    served = files / "pyfunc_model.py"
    served.write_text("import a_module_no_service_has\n" + served.read_text())
    evaluation = evaluate_version("unservable", version, _test_split(tmp_path / "data"), uri)
    gate = evaluation.fresh_load
    assert gate is not None and not gate.passed
    assert "a new process could not load and run it" in gate.detail
    assert "No module named 'a_module_no_service_has'" in gate.detail, gate.detail


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_evaluate_a_model_needing_what_it_never_declared_fails_the_fresh_load_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate loads the version in an environment of its declared requirements alone: served
    code importing dask (installed in this process, never declared) fails there; loaded by
    this installation (``CIFAR_FRESH_LOAD_ENV=installed``) it would have passed."""
    uri, version, files = _published(tmp_path, "undeclared")
    served = files / "pyfunc_model.py"
    served.write_text("import dask\n" + served.read_text())
    dataset = _test_split(tmp_path / "data")
    gate = evaluate_version("undeclared", version, dataset, uri).fresh_load
    assert gate is not None and not gate.passed
    assert "No module named 'dask'" in gate.detail, gate.detail
    monkeypatch.setenv("CIFAR_FRESH_LOAD_ENV", "installed")
    installed = evaluate_version("undeclared", version, dataset, uri).fresh_load
    assert installed is not None and installed.passed, installed


def test_evaluate_a_version_whose_declared_releases_are_not_installed_fails_in_installed_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, version, files = _published(tmp_path, "elsewhere-built")
    declared = files / "requirements.txt"
    declared.write_text(re.sub(r"numpy==\S+", "numpy==0.1", declared.read_text()))
    monkeypatch.setenv("CIFAR_FRESH_LOAD_ENV", "installed")
    gate = evaluate_version("elsewhere-built", version, _test_split(tmp_path / "data"), uri)
    assert gate.fresh_load is not None and not gate.fresh_load.passed
    assert "its declared environment cannot be had" in gate.fresh_load.detail
    assert "this installation is not its environment" in gate.fresh_load.detail


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_evaluate_import_leaves_matplotlib_alone() -> None:
    import subprocess
    import sys

    code = "import tasks.evaluate, sys; print('matplotlib.pyplot' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_evaluate_confusion_figure_labels_every_class() -> None:
    from mlops.evaluation import Evaluation

    evaluation = Evaluation(0.5, {}, [[1, 1], [0, 2]], 4, np.array([True, False, True, True]))
    figure = confusion_figure(evaluation, ("cat", "dog"))
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert labels == ["cat", "dog"]


def test_evaluate_a_fresh_load_gate_the_registry_cannot_answer_fails_instead_of_judging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once, no backoff
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens: the registry is down
    probe = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    with pytest.raises(GateCannotRunError, match="fresh_load could not run") as raised:
        fresh_load_gate("any", "1", gone, probe, np.zeros((2, 10), dtype=np.float32))
    assert gone in str(raised.value) and "Check that the MLflow server is up" in str(raised.value)
    assert "its python_env.yaml cannot be read" in str(raised.value.__cause__)
