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
from scipy.stats import norm

from mlops.paired_test import score

DEFAULT_MIN_TEST_ACCURACY = 0.0  # off until a team knows what a usable model scores
# no class may be shown to lose more than 2 points against the champion (a real 5-point drop
# in one of CIFAR-10's classes, 1,000 test images each, is shown; noise is not)
DEFAULT_MAX_CLASS_DROP = 0.02


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
    """No class is shown to lose more than ``max_drop`` (``max_class_drop``) of accuracy
    against the champion, on the same images: per class, a paired one-sided score test of
    "its drop is at most max_drop" (``mlops.paired_test.score`` at -max_drop), the classes'
    p-values judged together by Holm's step-down procedure at ``alpha`` (the chance of failing
    the gate when no class drops that much stays at most alpha). ``new`` and ``champion`` are
    the per-image results, ``labels`` the images' classes."""
    if champion is None:
        return Gate("class_drop", True, "no champion to compare the classes with")
    if labels is None:
        return Gate("class_drop", True, "no per-image classes to compare (an old evaluation)")
    tests = []
    for index, name in enumerate(class_names):
        mine = labels == index
        if not mine.any():
            continue
        b = int(np.sum(new[mine] & ~champion[mine]))
        c = int(np.sum(~new[mine] & champion[mine]))
        n = int(mine.sum())
        p = float(norm.cdf(score(b, c, n, -max_drop)))
        tests.append((p, name, float(champion[mine].mean()), float(new[mine].mean())))
    tests.sort()
    shown = []
    for i, test in enumerate(tests):  # Holm: the i-th smallest p against alpha / (m - i)
        if test[0] > alpha / (len(tests) - i):
            break
        shown.append(test)
    judged = f"paired test per class, Holm's correction over {len(tests)} classes, alpha {alpha:g}"
    if shown:
        listed = ", ".join(f"{n} ({was:.3f} to {now:.3f}, p={p:.2g})" for p, n, was, now in shown)
        return Gate(
            "class_drop",
            False,
            f"classes shown to lose more than {max_drop:g} (max_class_drop) against the "
            f"champion: {listed} ({judged})",
        )
    p, name, was, now = tests[0]
    return Gate(
        "class_drop",
        True,
        f"no class shown to lose more than {max_drop:g} (max_class_drop) against the champion; "
        f"the closest: {name} ({was:.3f} to {now:.3f}, p={p:.2g}) ({judged})",
    )
