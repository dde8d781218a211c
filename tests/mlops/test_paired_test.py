"""The paired decision, on per-image results built by hand, against a reference computed here
independently (the binomial tail summed exactly, the interval from its formula)."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from mlops.evaluation import ChampionScore
from mlops.paired_test import compare
from mlops.promotion import PromotionRule, decide


def pair(n: int, both: int, only_new: int, only_champion: int) -> tuple[np.ndarray, np.ndarray]:
    """Results on ``n`` images: ``both`` right for both, then ``only_new`` right only for the
    new model, ``only_champion`` only for the champion, the rest wrong for both."""
    new, champion = np.zeros(n, bool), np.zeros(n, bool)
    new[:both] = champion[:both] = True
    new[both : both + only_new] = True
    champion[both + only_new : both + only_new + only_champion] = True
    return new, champion


def reference_p(only_new: int, only_champion: int) -> float:
    """P(X >= only_new), X ~ Binomial(only_new + only_champion, 1/2), summed exactly."""
    m = only_new + only_champion
    return float(sum(Fraction(math.comb(m, k), 2**m) for k in range(only_new, m + 1)))


def reference_interval(n: int, b: int, c: int, alpha: float) -> tuple[float, float]:
    d = (b - c) / n
    se = math.sqrt((b + c) / n - ((b - c) / n) ** 2) / math.sqrt(n)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return d - z * se, d + z * se


def champion_of(correct: np.ndarray) -> ChampionScore:
    return ChampionScore("1", float(correct.mean()), correct, {}, "t", None, False)


@pytest.mark.parametrize(
    ("case", "n", "both", "only_new", "only_champion", "promoted"),
    [
        ("a real improvement", 1000, 700, 40, 10, True),
        ("an equal model", 1000, 800, 0, 0, False),
        ("a tiny noisy gain", 1000, 800, 6, 4, False),
        ("a small real gain on many images", 100_000, 80_000, 600, 450, True),
        ("a worse model", 1000, 700, 10, 40, False),
    ],
)
def test_paired_decision_and_numbers_match_the_reference(
    case: str, n: int, both: int, only_new: int, only_champion: int, promoted: bool
) -> None:
    new, champion = pair(n, both, only_new, only_champion)
    comparison = compare(new, champion, alpha=0.05)
    assert (comparison.only_new, comparison.only_champion) == (only_new, only_champion)
    assert comparison.new_accuracy == (both + only_new) / n
    assert comparison.champion_accuracy == (both + only_champion) / n
    expected_p = reference_p(only_new, only_champion) if only_new + only_champion else 1.0
    assert comparison.p_value == pytest.approx(expected_p, rel=1e-9)
    low, high = reference_interval(n, only_new, only_champion, 0.05)
    assert (comparison.low, comparison.high) == (pytest.approx(low), pytest.approx(high))
    decision, reason = decide(new, PromotionRule(0.0, 0.05), champion_of(champion), False)
    assert decision is promoted, (case, reason)
    assert f"p={comparison.p_value:.3g}" in reason


def test_paired_decision_a_stricter_level_keeps_a_borderline_gain() -> None:
    new, champion = pair(1000, 700, 20, 8)  # p = 0.018
    assert reference_p(20, 8) == pytest.approx(0.0178, abs=1e-4)
    assert decide(new, PromotionRule(0.0, 0.05), champion_of(champion), False)[0] is True
    promoted, reason = decide(new, PromotionRule(0.0, 0.01), champion_of(champion), False)
    assert promoted is False and "not significant at alpha 0.01" in reason


def test_paired_test_refuses_results_on_different_images() -> None:
    with pytest.raises(ValueError, match="same, non-empty test split"):
        compare(np.ones(10, bool), np.ones(11, bool), 0.05)
    with pytest.raises(ValueError, match=r"promote_alpha=1\.5 must be between 0 and 1"):
        decide(np.ones(10, bool), PromotionRule(0.0, 1.5), None, False)
