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


def test_class_drop_names_the_class_that_lost_most() -> None:
    champion = {"cat": 0.8, "dog": 0.7, "ship": 0.9}
    within = class_drop({"cat": 0.75, "dog": 0.9, "ship": 0.9}, champion, 0.1)
    assert within.passed and "cat (0.800 to 0.750), within the bound 0.1" in within.detail
    beyond = class_drop({"cat": 0.8, "dog": 0.55, "ship": 0.95}, champion, 0.1)
    assert not beyond.passed and "dog (0.700 to 0.550), beyond the bound 0.1" in beyond.detail
    assert class_drop({"cat": 0.0}, None, 0.1).passed  # no champion: nothing to lose against


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
