"""The paired decision, on per-image results built by hand, against a reference computed here
independently: the restricted maximum-likelihood estimate found numerically (not Tango's closed
form), the score statistic from it, and each confidence limit by bisection."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from mlops.evaluation import ChampionScore, Evaluation
from mlops.ledger import Entry, next_place
from mlops.paired_test import compare, smallest_shown
from mlops.promotion import PromotionRule, decide


def pair(n: int, both: int, only_new: int, only_champion: int) -> tuple[np.ndarray, np.ndarray]:
    """Results on ``n`` images: ``both`` right for both, then ``only_new`` right only for the
    new model, ``only_champion`` only for the champion, the rest wrong for both."""
    new, champion = np.zeros(n, bool), np.zeros(n, bool)
    new[:both] = champion[:both] = True
    new[both : both + only_new] = True
    champion[both + only_new : both + only_new + only_champion] = True
    return new, champion


def reference_score(b: int, c: int, n: int, delta: float) -> float:
    """Z(Δ): P(champion only) = q maximises the likelihood b·log(q + Δ) + c·log(q) +
    (n - b - c)·log(1 - 2q - Δ) over its range, found by a bounded search; the distance
    shrunk by one image."""
    low, high = max(0.0, -delta), (1 - delta) / 2

    def minus_log_likelihood(q: float) -> float:
        terms = [(b, q + delta), (c, q), (n - b - c, 1 - 2 * q - delta)]
        return -sum(k * math.log(max(p, 1e-300)) for k, p in terms if k)

    q = (
        low
        if high - low < 1e-15
        else minimize_scalar(
            minus_log_likelihood, bounds=(low, high), method="bounded", options={"xatol": 1e-13}
        ).x
    )
    distance = b - c - n * delta
    corrected = math.copysign(max(abs(distance) - 1, 0.0), distance)
    variance = n * (2 * q + delta * (1 - delta))
    return corrected / math.sqrt(variance) if variance > 0 else math.copysign(math.inf, corrected)


def reference_limit(b: int, c: int, n: int, alpha: float, lower: bool) -> float:
    """The Δ where Z(Δ) = ±z_{1-alpha}, by bisection (Z decreases in Δ)."""
    z = NormalDist().inv_cdf(1 - alpha) * (1 if lower else -1)
    lo, hi = -1 + 1e-9, 1 - 1e-9
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reference_score(b, c, n, mid) > z else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize(
    ("case", "n", "both", "b", "c", "verdict"),
    [
        ("a real improvement", 1000, 700, 40, 10, "better"),
        ("an equal model, no image differs", 1000, 800, 0, 0, "not shown"),
        ("ties on 200 images", 200, 150, 0, 0, "not shown"),
        ("four images only, one way (exact p 0.0625)", 200, 150, 4, 0, "not shown"),
        ("five images only, one way (exact p 0.031)", 200, 150, 5, 0, "better"),
        ("a tiny noisy gain", 1000, 800, 6, 4, "not shown"),
        ("a small real gain on many images", 100_000, 80_000, 600, 450, "better"),
        ("a worse model", 1000, 700, 10, 40, "worse"),
        ("the docs' example: 160 against 130 of 10,000", 10_000, 8000, 160, 130, "better"),
    ],
)
def test_paired_limits_match_the_reference(
    case: str, n: int, both: int, b: int, c: int, verdict: str
) -> None:
    new, champion = pair(n, both, b, c)
    comparison = compare(new, champion, alpha=0.05)
    assert (comparison.only_new, comparison.only_champion) == (b, c)
    assert comparison.difference == pytest.approx((b - c) / n)
    assert comparison.low == pytest.approx(reference_limit(b, c, n, 0.05, True), abs=1e-6)
    assert comparison.high == pytest.approx(reference_limit(b, c, n, 0.05, False), abs=1e-6)
    assert -1 <= comparison.low < comparison.high <= 1, "an interval, never a point"
    assert comparison.verdict == verdict, case


@pytest.mark.parametrize(("b", "c"), [(b, c) for b in range(0, 30, 3) for c in range(0, 20, 4)])
def test_paired_with_margin_0_the_bound_is_the_one_sided_mcnemar_test(b: int, c: int) -> None:
    """The lower limit is above 0 exactly when the continuity-corrected McNemar statistic
    (b - c - 1) / sqrt(b + c) is above z_{0.95}."""
    new, champion = pair(1000, 500, b, c)
    significant = b + c > 0 and (b - c - 1) / math.sqrt(b + c) > NormalDist().inv_cdf(0.95)
    assert (compare(new, champion, 0.05).low > 0) is significant


def test_paired_smallest_shown_gain_is_the_least_that_clears_the_margin() -> None:
    least = smallest_shown(300, 10_000, 0.95, 0.005)
    assert least is not None
    b = round((300 + least * 10_000) / 2)
    assert reference_limit(b, 300 - b, 10_000, 0.05, True) > 0.005
    assert reference_limit(b - 1, 301 - b, 10_000, 0.05, True) <= 0.005
    assert smallest_shown(4, 200, 0.95, 0.005) is None  # 4 differing images can show nothing


def _evaluation(correct: np.ndarray) -> Evaluation:
    labels = np.arange(len(correct)) % 10
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (labels, np.where(correct, labels, (labels + 1) % 10)), 1)
    return Evaluation(float(correct.mean()), {}, confusion.tolist(), len(correct), correct)


def champion_of(correct: np.ndarray) -> ChampionScore:
    return ChampionScore("1", float(correct.mean()), correct, {}, "t", None, False)


def test_paired_decision_spends_less_alpha_on_later_comparisons() -> None:
    new, champion = pair(1000, 700, 30, 10)  # lower limit 0.0065 at 0.05
    shown_nothing = [
        Entry(k, "t", str(k), "1", "", 1000, 0, 0, 1e-9, -1.0, 1.0, "not shown", 1)
        for k in range(1, 10)
    ]
    at = {k: next_place(shown_nothing[: k - 1], "t", "v", 0.05) for k in (1, 10)}
    first, tenth = (
        decide(_evaluation(new), PromotionRule(), champion_of(champion), False, (), at[k], 0.05)
        for k in (1, 10)
    )
    assert first.promoted and not tenth.promoted
    assert first.comparison is not None and tenth.comparison is not None
    assert 1 - first.comparison.confidence == pytest.approx(0.05 * (6 / math.pi**2) ** 2)
    assert 1 - tenth.comparison.confidence == pytest.approx(0.05 * (6 / math.pi**2) ** 2 / 100)
    assert "comparison 10 on test split 1 of this model" in tenth.reason
    assert "champion version 1 stays" in tenth.reason


def test_paired_decision_a_first_version_must_beat_chance() -> None:
    chance = decide(_evaluation(np.arange(200) < 22), PromotionRule(), None, False)
    assert not chance.promoted and "not better than chance" in chance.reason
    good = decide(_evaluation(np.arange(200) < 60), PromotionRule(), None, False)
    assert good.promoted and "better than chance" in good.reason


def test_paired_test_refuses_results_on_different_images() -> None:
    with pytest.raises(ValueError, match="same, non-empty test split"):
        compare(np.ones(10, bool), np.ones(11, bool), 0.05)
    with pytest.raises(ValueError, match=r"promote_alpha=1\.5 must be between 0 and 1"):
        PromotionRule(0.0, 1.5)
