"""Release gates: what a version must pass before ``@champion`` moves to it, whatever the paired
test says. Each gate is a parameter with a documented default (``PromotionRule``) and its
outcome is recorded on the version (tag ``gate/<name>``). A version that fails one becomes
``@challenger`` with the failed gate as its reason; the run still succeeds (the gate worked).
No Prefect, no MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

DEFAULT_MIN_TEST_ACCURACY = 0.0  # off until a team knows what a usable model scores
DEFAULT_MAX_CLASS_DROP = 0.1  # no class may lose more than 10 points against the champion


class GateCannotRunError(RuntimeError):
    """A release gate could not be checked (the registry did not answer): the run fails and
    nothing is published, rather than counting the gate as failed or passed."""


@dataclass(frozen=True)
class Gate:
    """One gate's outcome for one version."""

    name: str
    passed: bool
    detail: str  # one sentence, with the figures


def accuracy_floor(accuracy: float, floor: float) -> Gate:
    """The version's test accuracy is at least ``floor`` (``min_test_accuracy``)."""
    passed = accuracy >= floor
    relation = "is at least" if passed else "is below"
    return Gate(
        "accuracy_floor",
        passed,
        f"test accuracy {accuracy:.4f} {relation} the floor {floor:g} (min_test_accuracy)",
    )


def fresh_load(expected: np.ndarray, got: np.ndarray | str) -> Gate:
    """Loaded from the registry in a new process, the version scores the probe images as the
    evaluation did: the same classes, the same probabilities to 1e-4 (``got``: that process's
    scores, or why it failed)."""
    if isinstance(got, str):
        return Gate("fresh_load", False, f"loaded from the registry, {got}")
    shifted = got - got.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    same_classes = bool((probabilities.argmax(1) == expected.argmax(1)).all())
    largest = float(np.abs(probabilities - expected).max())
    passed = same_classes and largest <= 1e-4
    relation = "as" if passed else "differently from"
    return Gate(
        "fresh_load",
        passed,
        f"loaded from the registry in a new process, it scored {len(expected)} test images "
        f"{relation} the evaluation (largest difference {largest:.1e})",
    )


def class_drop(
    new: Mapping[str, float], champion: Mapping[str, float] | None, max_drop: float
) -> Gate:
    """No class's test accuracy is lower than the champion's, on the same images, by more than
    ``max_drop`` (``max_class_drop``)."""
    shared = [name for name in new if champion is not None and name in champion]
    if champion is None or not shared:
        return Gate("class_drop", True, "no champion to compare the classes with")
    worst = max(shared, key=lambda name: champion[name] - new[name])
    drop = champion[worst] - new[worst]
    passed = drop <= max_drop
    relation = "within" if passed else "beyond"
    return Gate(
        "class_drop",
        passed,
        f"the class that lost most against the champion is {worst} ({champion[worst]:.3f} to "
        f"{new[worst]:.3f}), {relation} the bound {max_drop:g} (max_class_drop)",
    )
