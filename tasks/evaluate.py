"""Evaluation of a registered model on the held-out test split."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.artifacts import create_table_artifact
from torch import nn

from cifar.dataset import Dataset, read_split
from tasks.predict import score
from tasks.registry import load_version


@dataclass(frozen=True)
class Evaluation:
    """Test-set figures of one model version."""

    accuracy: float
    per_class_accuracy: dict[str, float]
    confusion: list[list[int]]  # rows: true class, columns: predicted class
    num_images: int


def evaluate_model(model: nn.Module, dataset: Dataset) -> Evaluation:
    """Accuracy, per-class accuracy and confusion matrix on the dataset's test split."""
    test = read_split(dataset, "test")
    predicted = score(model, test.images).argmax(1)
    class_names = dataset.manifest.class_names
    confusion = np.zeros((len(class_names), len(class_names)), dtype=np.int64)
    np.add.at(confusion, (test.labels, predicted), 1)
    per_class = confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)
    return Evaluation(
        accuracy=float((predicted == test.labels).mean()),
        per_class_accuracy={n: float(a) for n, a in zip(class_names, per_class, strict=True)},
        confusion=confusion.tolist(),
        num_images=len(test.labels),
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


def record_evaluation(
    evaluation: Evaluation,
    class_names: tuple[str, ...],
    run_id: str,
    model_name: str,
    version: str,
    tracking_uri: str,
) -> None:
    """Put the figures on the MLflow run and on the model version."""
    client = MlflowClient(tracking_uri)
    figures = {"test_accuracy": evaluation.accuracy} | {
        f"test_accuracy_{name}": accuracy
        for name, accuracy in evaluation.per_class_accuracy.items()
    }
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in figures.items()])
    client.log_figure(
        run_id, confusion_figure(evaluation, class_names), "evaluation/confusion_matrix.png"
    )
    client.set_model_version_tag(model_name, version, "test_accuracy", f"{evaluation.accuracy:.6f}")
    client.set_model_version_tag(model_name, version, "test_images", str(evaluation.num_images))


def evaluate_version(
    model_name: str, version: str, dataset: Dataset, run_id: str, tracking_uri: str
) -> Evaluation:
    """Evaluate the registered version (loaded from the registry) and record the figures."""
    evaluation = evaluate_model(load_version(model_name, version, tracking_uri), dataset)
    class_names = dataset.manifest.class_names
    record_evaluation(evaluation, class_names, run_id, model_name, version, tracking_uri)
    return evaluation


@task(name="evaluate")
def evaluate_task(
    model_name: str, version: str, dataset: Dataset, run_id: str, tracking_uri: str
) -> Evaluation:
    """Evaluate and record, with the confusion matrix as a Prefect table."""
    evaluation = evaluate_version(model_name, version, dataset, run_id, tracking_uri)
    class_names = dataset.manifest.class_names
    create_table_artifact(
        key="confusion-matrix",
        table=[
            {"true": name, **dict(zip(class_names, row, strict=True))}
            for name, row in zip(class_names, evaluation.confusion, strict=True)
        ],
        description=f"{model_name} v{version}: test accuracy {evaluation.accuracy:.4f}",
    )
    return evaluation
