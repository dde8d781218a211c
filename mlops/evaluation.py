"""Evaluation of a registered model on the held-out test split (``score``: a model's class
probabilities for images, also what predict-cifar writes).

Besides its figures, each evaluation keeps which test images the model classified correctly:
the evidence, stored with the model that produced it, as the artifact
``evaluation/correct-<test split digest>.npy`` of the version's LoggedModel, its sha256 on the
version (tag ``evidence/<test split digest>``). The promotion's paired test reads the champion's
from there instead of scoring it again, and trusts it only if the hash matches. Keyed by the
model, not by the training run: two versions of one run (the same ``run_name`` published
again) never share or overwrite each other's evidence.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
from matplotlib.figure import Figure
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from torch import nn

from cifar.dataset import Dataset, read_split
from cifar.format import CLASS_NAMES, Batch
from mlops.evidence import accuracy_tag, keep_evidence, read_evidence
from mlops.lineage import DIGEST_TAG, SYNTHETIC_TAG, log_test_input
from mlops.model_loading import check_readable, load_version, scores_in_fresh_process
from mlops.registry import logged_model_id, version_at_alias
from mlops.release_gates import Gate, GateCannotRunError, fresh_load
from mlops.version_tags import CHAMPION

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """Test-set figures of one model version."""

    accuracy: float
    per_class_accuracy: dict[str, float]
    confusion: list[list[int]]  # rows: true class, columns: predicted class
    num_images: int
    correct: np.ndarray  # per test image, in the split's order: classified correctly
    fresh_load: Gate | None = None  # the version loaded in a new process: the same scores?
    labels: np.ndarray | None = None  # per test image: its class (the class gate needs it)


@dataclass(frozen=True)
class ChampionScore:
    """The champion measured on the current run's test split (``test_digest``)."""

    version: str
    accuracy: float
    correct: np.ndarray  # per test image (in the split's order): classified correctly
    per_class_accuracy: dict[str, float]
    test_digest: str
    data_digest: str | None  # what it was trained on (None: registered before lineage)
    synthetic: bool


def score(model: nn.Module, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
    """Class probabilities (N, 10) for uint8 images. Batches of 128 stay in a CPU's caches:
    1,000 images took 0.56 s at 128 and 0.89 s at 1,024 on 2 cores (small_cnn)."""
    probabilities = [np.zeros((0, len(CLASS_NAMES)), dtype=np.float32)]
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            logits = model.eval()(torch.from_numpy(images[start : start + batch_size]))
            probabilities.append(torch.softmax(logits.float(), dim=1).numpy())
    return np.concatenate(probabilities)


def per_class_accuracy(
    correct: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...]
) -> dict[str, float]:
    """Each class's accuracy from per-image results and the images' true labels."""
    right = np.bincount(labels, weights=correct.astype(float), minlength=len(class_names))
    total = np.maximum(np.bincount(labels, minlength=len(class_names)), 1)
    return {name: float(a) for name, a in zip(class_names, right / total, strict=True)}


def evaluate_model(model: nn.Module, test: Batch, class_names: tuple[str, ...]) -> Evaluation:
    """Accuracy, per-class accuracy and confusion matrix on the test images."""
    predicted = score(model, test.images).argmax(1)
    confusion = np.zeros((len(class_names), len(class_names)), dtype=np.int64)
    np.add.at(confusion, (test.labels, predicted), 1)
    per_class = confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)
    return Evaluation(
        accuracy=float((predicted == test.labels).mean()),
        per_class_accuracy={n: float(a) for n, a in zip(class_names, per_class, strict=True)},
        confusion=confusion.tolist(),
        num_images=len(test.labels),
        correct=predicted == test.labels,
        labels=np.asarray(test.labels),
    )


def confusion_figure(evaluation: Evaluation, class_names: tuple[str, ...]) -> Figure:
    """The confusion matrix as a labelled heat map (no pyplot: no global backend state)."""
    figure = Figure(figsize=(7, 6))
    axes = figure.subplots()
    matrix = np.array(evaluation.confusion)
    axes.imshow(matrix, cmap="Blues")
    axes.set_xticks(range(len(class_names)), class_names, rotation=45, ha="right")
    axes.set_yticks(range(len(class_names)), class_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"test accuracy {evaluation.accuracy:.3f} ({evaluation.num_images} images)")
    for (row, col), count in np.ndenumerate(matrix):
        axes.text(col, row, str(count), ha="center", va="center", fontsize=7)
    figure.tight_layout()
    return figure


EVALUATION_RUN_TAG = "evaluation_run"  # the version's tag naming its evaluation's MLflow run


def record_evaluation(
    evaluation: Evaluation,
    dataset: Dataset,
    model_name: str,
    version: str,
    tracking_uri: str,
) -> str:
    """Record the evaluation as an MLflow run of its own, nested under the version's training
    run: the test split and the evaluated LoggedModel as its inputs, the figures as its metrics
    linked to both, the confusion matrix; on the version, the figures (``test_accuracy``, and
    ``test_accuracy/{test digest}``: its accuracy on that split), the evidence and the run's id.
    The training run lists its training and validation data only. Returns the run's id."""
    client = MlflowClient(tracking_uri)
    test_digest = dataset.manifest.digest("test")
    model_id = logged_model_id(model_name, version, tracking_uri)
    found = client.get_model_version(model_name, version)
    training = client.get_run(found.run_id) if found.run_id else None
    run = client.create_run(
        training.info.experiment_id if training else "0",
        run_name=f"evaluate {model_name} v{version} on {test_digest}",
        tags={
            **({"mlflow.parentRunId": training.info.run_id} if training else {}),
            "model_name": model_name,
            "model_version": version,
        },
    )
    run_id = run.info.run_id
    source = training.info.run_id if training else None
    test_name = log_test_input(tracking_uri, run_id, dataset, model_id, source_run_id=source)
    figures = {"test_accuracy": evaluation.accuracy} | {
        f"test_accuracy_{name}": accuracy
        for name, accuracy in evaluation.per_class_accuracy.items()
    }
    now = int(time.time() * 1000)
    linked = {"model_id": model_id, "dataset_name": test_name, "dataset_digest": test_digest}
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0, **linked) for k, v in figures.items()])
    client.log_figure(
        run_id,
        confusion_figure(evaluation, dataset.manifest.class_names),
        "evaluation/confusion_matrix.png",
    )
    client.set_terminated(run_id)
    client.set_model_version_tag(model_name, version, "test_accuracy", f"{evaluation.accuracy:.6f}")
    client.set_model_version_tag(model_name, version, "test_images", str(evaluation.num_images))
    client.set_model_version_tag(model_name, version, EVALUATION_RUN_TAG, run_id)
    keep_evidence(client, model_name, version, test_digest, evaluation.correct)
    client.set_model_version_tag(
        model_name, version, accuracy_tag(test_digest), f"{evaluation.accuracy:.6f}"
    )
    return run_id


def champion_score(model_name: str, dataset: Dataset, tracking_uri: str) -> ChampionScore | None:
    """The ``@champion`` version's per-image results and accuracy on this dataset's test split
    (None: no champion).

    Read from its evidence on the split (``read_evidence``) when it was evaluated on it already;
    otherwise evaluated now and kept, so each version is evaluated once per test split.
    """
    version = version_at_alias(model_name, CHAMPION, tracking_uri)
    if version is None:
        return None
    test_digest = dataset.manifest.digest("test")
    test = read_split(dataset, "test")
    client = MlflowClient(tracking_uri)
    tags = client.get_model_version(model_name, version).tags
    correct = read_evidence(client, model_name, version, test_digest)
    if correct is None or len(correct) != dataset.manifest.rows("test"):
        model = load_version(model_name, version, tracking_uri)
        evaluation = evaluate_model(model, test, dataset.manifest.class_names)
        record_evaluation(evaluation, dataset, model_name, version, tracking_uri)
        correct = evaluation.correct
        logger.info(
            "Champion %s version %s evaluated on test split %s: %.4f",
            model_name,
            version,
            test_digest,
            correct.mean(),
        )
    labels = test.labels
    return ChampionScore(
        version=version,
        accuracy=float(correct.mean()),
        correct=correct,
        per_class_accuracy=per_class_accuracy(correct, labels, dataset.manifest.class_names),
        test_digest=test_digest,
        data_digest=tags.get(DIGEST_TAG),
        synthetic=tags.get(SYNTHETIC_TAG) == "true",
    )


PROBE_IMAGES = 16  # the test images a new process scores for the fresh_load gate


def evaluate_version(
    model_name: str,
    version: str,
    dataset: Dataset,
    tracking_uri: str,
    check_fresh_load: bool = True,
) -> Evaluation:
    """Evaluate the registered version (loaded from the registry) and record the figures
    (``record_evaluation``: a run of its own, nested under the version's training run);
    with ``check_fresh_load``, also load it in a new process and compare its scores of the
    first ``PROBE_IMAGES`` test images (the release gate ``fresh_load``).

    Raises:
        GateCannotRunError: The new process failed and the registry does not answer this one
            either: the gate could not run.
    """
    model = load_version(model_name, version, tracking_uri)
    test = read_split(dataset, "test")
    evaluation = evaluate_model(model, test, dataset.manifest.class_names)
    if check_fresh_load:
        probe = test.images[:PROBE_IMAGES]
        gate = fresh_load_gate(model_name, version, tracking_uri, probe, score(model, probe))
        evaluation = replace(evaluation, fresh_load=gate)
    record_evaluation(evaluation, dataset, model_name, version, tracking_uri)
    return evaluation


def fresh_load_gate(
    model_name: str, version: str, tracking_uri: str, probe: np.ndarray, expected: np.ndarray
) -> Gate:
    """The gate ``fresh_load``: ``version`` loaded from the registry by a new process scores
    ``probe`` as ``expected`` (this process's scores).

    Raises:
        GateCannotRunError: The new process failed and the registry does not answer this one
            either (it is down, or the network): a failure of the check, not of the version.
    """
    try:
        got: np.ndarray | str = scores_in_fresh_process(model_name, version, tracking_uri, probe)
    except RuntimeError as error:
        try:
            check_readable(model_name, version, tracking_uri)
        except Exception as unreachable:
            raise GateCannotRunError(
                f"The release gate fresh_load could not run: the registry at {tracking_uri} "
                f"does not answer ({type(unreachable).__name__}: {unreachable}). Check that "
                f"the MLflow server is up and reachable, then run the flow again."
            ) from error
        got = str(error)
    return fresh_load(expected, got)
