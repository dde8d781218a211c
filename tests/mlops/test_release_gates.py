"""The release gates' verdicts and sentences, on figures built by hand."""

from __future__ import annotations

import numpy as np

from mlops.release_gates import accuracy_floor, class_drop, fresh_load


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


LOGITS = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0]])


def test_accuracy_floor() -> None:
    assert accuracy_floor(0.5, 0.5).passed
    below = accuracy_floor(0.4999, 0.5)
    assert not below.passed
    assert below.detail == "test accuracy 0.4999 is below the floor 0.5 (min_test_accuracy)"


def _class_results(
    rng: np.random.Generator, drops: dict[int, float], per_class: int = 1000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(new, champion, labels) for 10 classes of ``per_class`` images with per-image difficulty
    (easy, hopeless or ambiguous, as test images are: about 93% accuracy, two equal models
    disagreeing on about 4% of images, as in test_promotion_simulation.py); the new model's
    accuracy is lower by ``drops[c]`` on class c."""
    labels = np.repeat(np.arange(10), per_class)
    kind = rng.random(labels.size)
    p = np.where(kind < 0.9, 0.995, np.where(kind < 0.93, 0.02, rng.uniform(0.1, 0.9, kind.size)))
    q = p.copy()
    for c, drop in drops.items():
        mine = labels == c
        q[mine] = p[mine] * (1 - drop / p[mine].mean())
    return rng.random(labels.size) < q, rng.random(labels.size) < p, labels


NAMES = [f"class{i}" for i in range(10)]


def test_class_drop_fails_a_five_point_drop_in_one_class() -> None:
    """A 5-point drop in one class of 1,000 images is not shown to be at most 4 points (it
    passes under 1% of the time: at most one seed in 40)."""
    results = [_class_results(np.random.default_rng(seed), {3: 0.05}) for seed in range(40)]
    gates = [class_drop(*result, NAMES, 0.04, 0.05) for result in results]
    assert sum(gate.passed for gate in gates) <= 1
    failed = next(gate for gate in gates if not gate.passed)
    assert failed.detail.startswith(
        "classes not shown to lose at most 0.04 (max_class_drop) against the champion: class3 ("
    ), failed.detail
    assert "on 1000 images, lower limit -0.0" in failed.detail
    assert "lower 0.95 confidence limit of each class's paired difference, 10 classes" in (
        failed.detail
    )


def test_class_drop_passes_an_equally_good_model_and_a_model_without_champion() -> None:
    rng = np.random.default_rng(1)
    gates = [class_drop(*_class_results(rng, {}), NAMES, 0.04, 0.05) for _ in range(20)]
    assert all(gate.passed for gate in gates), [g.detail for g in gates if not g.passed]
    assert gates[0].detail.startswith(
        "every class shown to lose at most 0.04 (max_class_drop) against the champion; the closest"
    )
    new, _, labels = _class_results(rng, {})
    assert class_drop(new, None, labels, NAMES, 0.04, 0.05).passed  # nothing to lose against


def test_class_drop_lets_a_class_truly_at_the_margin_through_at_most_alpha_of_the_time() -> None:
    """The size of the non-inferiority test: a class that truly lost exactly max_class_drop,
    at several churns, passes at most alpha of the time (2,000 draws each; 3 standard errors
    of slack)."""
    rng = np.random.default_rng(7)
    n, margin, alpha = 1000, 0.04, 0.05
    labels = np.zeros(n, dtype=int)
    for churn in (0.02, 0.05, 0.10):
        passed = 0
        for _ in range(2000):
            only_new, only_champion, _ = rng.multinomial(
                n, [churn / 2, churn / 2 + margin, 1 - churn - margin]
            )
            new = np.zeros(n, dtype=bool)
            champion = np.zeros(n, dtype=bool)
            new[:only_new] = True
            champion[only_new : only_new + only_champion] = True
            passed += class_drop(new, champion, labels, NAMES[:1], margin, alpha).passed
        assert passed / 2000 <= alpha + 3 * (alpha * (1 - alpha) / 2000) ** 0.5, churn


def test_class_drop_puts_the_burden_on_the_candidate_and_can_be_turned_off() -> None:
    """20 images a class cannot show a drop of at most 4 points, even for the same model."""
    new, _, labels = _class_results(np.random.default_rng(2), {}, per_class=20)
    gate = class_drop(new, new.copy(), labels, NAMES, 0.04, 0.05)
    assert not gate.passed
    assert "on 20 images" in gate.detail and "more test images per class" in gate.detail
    off = class_drop(new, new.copy(), labels, NAMES, 1.0, 0.05)
    assert off.passed and off.detail == "off (max_class_drop 1)"


def test_fresh_load_compares_the_new_process_scores_with_the_evaluations() -> None:
    expected = softmax(LOGITS)
    same = fresh_load(expected, LOGITS.copy())
    assert same.passed and "scored 2 test images as the evaluation" in same.detail
    swapped = fresh_load(expected, LOGITS[:, ::-1].copy())  # other classes: another model
    assert not swapped.passed and "differently from the evaluation" in swapped.detail
    nudged = fresh_load(expected, LOGITS + np.array([[0.0, 0.01, 0.0], [0.0, 0.0, 0.0]]))
    assert not nudged.passed  # the same classes, but not the same probabilities
    failed = fresh_load(expected, "a new process could not load and run it: No module named 'x'")
    assert not failed.passed
    assert failed.detail == (
        "loaded from the registry, a new process could not load and run it: No module named 'x'"
    )
