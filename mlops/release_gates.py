"""Release gates: what a version must pass before ``@champion`` moves to it, whatever the paired
test says. Each gate is a parameter with a documented default (``PromotionRule``) and its
outcome is recorded on the version (tag ``gate/<name>``). A version that fails one becomes
``@challenger`` with the failed gate as its reason; the run still succeeds (the gate worked).
No Prefect, no MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mlops.paired_test import lower_bound

DEFAULT_MIN_TEST_ACCURACY = 0.0  # off until a team knows what a usable model scores
# each class must be shown to lose at most 4 points against the champion: on CIFAR-10's 1,000
# test images a class, an equally good version passes (every class) 100% of the time at 5%
# of a class's images changing hands, 86% at 10%; a class that truly lost 5 points passes
# under 1% of the time (benchmarks/class_gate.py)
DEFAULT_MAX_CLASS_DROP = 0.04


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
    new: np.ndarray,
    champion: np.ndarray | None,
    labels: np.ndarray | None,
    class_names: Sequence[str],
    max_drop: float,
    alpha: float,
) -> Gate:
    """Every class is shown to lose at most ``max_drop`` (``max_class_drop``) of accuracy
    against the champion, on the same images: a non-inferiority test per class, its paired
    difference's lower confidence limit at ``1 - alpha`` (``mlops.paired_test.lower_bound``)
    above ``-max_drop``. The gate passes only if every class passes (an intersection-union
    test: a version with some class truly ``max_drop`` worse passes at most ``alpha`` of the
    time, with no correction for the number of classes). The burden is on the candidate: a
    class with too few images to show it fails. ``max_drop`` 1 turns the gate off. ``new`` and
    ``champion`` are the per-image results, ``labels`` the images' classes."""
    if champion is None:
        return Gate("class_drop", True, "no champion to compare the classes with")
    if labels is None:
        return Gate("class_drop", True, "no per-image classes to compare (an old evaluation)")
    if max_drop >= 1.0:
        return Gate("class_drop", True, "off (max_class_drop 1)")
    bounds = []
    for index, name in enumerate(class_names):
        mine = labels == index
        if not mine.any():
            continue
        b = int(np.sum(new[mine] & ~champion[mine]))
        c = int(np.sum(~new[mine] & champion[mine]))
        n = int(mine.sum())
        limit = lower_bound(b, c, n, 1.0 - alpha)
        bounds.append((limit, name, float(champion[mine].mean()), float(new[mine].mean()), n))
    bounds.sort()
    judged = (
        f"lower {1 - alpha:g} confidence limit of each class's paired difference, "
        f"{len(bounds)} classes"
    )
    failed = [bound for bound in bounds if bound[0] <= -max_drop]
    if failed:
        listed = ", ".join(
            f"{name} ({was:.3f} to {now:.3f} on {n} images, lower limit {limit:+.3f})"
            for limit, name, was, now, n in failed
        )
        return Gate(
            "class_drop",
            False,
            f"classes not shown to lose at most {max_drop:g} (max_class_drop) against the "
            f"champion: {listed} ({judged}; a class with few images cannot show it: more test "
            "images per class, or a larger max_class_drop)",
        )
    limit, name, was, now, n = bounds[0]
    return Gate(
        "class_drop",
        True,
        f"every class shown to lose at most {max_drop:g} (max_class_drop) against the champion; "
        f"the closest: {name} ({was:.3f} to {now:.3f} on {n} images, lower limit {limit:+.3f}) "
        f"({judged})",
    )
