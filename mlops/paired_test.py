"""Is a new model better than the champion by more than a margin, or only luckier? A score
confidence bound for the paired difference of accuracies, on the same images.

Both models are scored on the same ``n`` test images, so the evidence is paired: what matters is
the images one gets right and the other wrong (``only_new`` = b, ``only_champion`` = c). The
gain is the difference of accuracies, Δ = p_new - p_champion. Its confidence limits are Tango's
score limits for the difference of paired proportions (T. Tango, "Equivalence test and
confidence interval for the difference in proportions for the paired-sample design", Statistics
in Medicine 17:891-908, 1998; recommended by R. G. Newcombe, Statistics in Medicine
17:2635-2650, 1998, among ten methods): Δ's limit at level 1 - alpha is where the score statistic

    Z(Δ) = (b - c - nΔ) / sqrt(n (2 q̂(Δ) + Δ (1 - Δ)))

reaches z_{1-alpha}, with q̂(Δ) the maximum-likelihood estimate of P(champion only) given Δ (a
root of a quadratic), and the distance b - c - nΔ shrunk by one image (continuity correction).
Unlike Wald's interval it stays inside [-1, 1], is not zero-width when b = c = 0, and keeps its
coverage with few discordant images. With margin 0, "the lower limit is above 0" is exactly the
one-sided continuity-corrected McNemar test, (b - c - 1) / √(b + c) > z_{1-alpha}, which follows
McNemar's exact test closely (b = 4, c = 0: p = 0.0625 exact, not shown at alpha = 0.05): the bound
and the test are one decision. No Prefect, no MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

Verdict = Literal["better", "not shown", "worse"]
_EDGE = 1e-12
CONTINUITY = 1.0  # one image: the score's distance is shrunk by it (Tango's corrected form)


def score(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic Z(Δ), continuity-corrected, for ``b`` images only the new model
    gets right and ``c`` only the champion, of ``n``: large when the data say the gain is
    above ``delta``."""
    w = -b - c + (2 * n - b + c) * delta
    q = (math.sqrt(max(w * w + 8 * n * c * delta * (1 - delta), 0.0)) - w) / (4 * n)
    variance = n * (2 * q + delta * (1 - delta))
    distance = b - c - n * delta
    numerator = math.copysign(max(abs(distance) - CONTINUITY, 0.0), distance)
    if variance <= 0.0:
        return math.copysign(math.inf, numerator) if numerator else 0.0
    return numerator / math.sqrt(variance)


def lower_bound(b: int, c: int, n: int, confidence: float) -> float:
    """The one-sided lower confidence limit of the gain at ``confidence`` (e.g. 0.95)."""
    z = float(norm.ppf(confidence))
    return _solve(lambda d: score(b, c, n, d) - z)


def upper_bound(b: int, c: int, n: int, confidence: float) -> float:
    """The one-sided upper confidence limit of the gain at ``confidence``."""
    z = float(norm.ppf(confidence))
    return _solve(lambda d: score(b, c, n, d) + z)


def _solve(f: Callable[[float], float]) -> float:
    """The Δ in (-1, 1) where the decreasing ``f`` crosses 0 (its ends when it does not)."""
    lo, hi = -1 + _EDGE, 1 - _EDGE
    f_lo, f_hi = f(lo), f(hi)
    if f_lo <= 0:
        return -1.0
    if f_hi >= 0:
        return 1.0
    return float(brentq(f, lo, hi, xtol=1e-10))


@dataclass(frozen=True)
class PairedComparison:
    """Two models' per-image correctness on the same test images, compared."""

    num_images: int
    new_accuracy: float
    champion_accuracy: float
    only_new: int  # images only the new model classifies correctly
    only_champion: int  # images only the champion classifies correctly
    confidence: float  # of each one-sided limit, 1 - the alpha spent on this comparison
    low: float  # the one-sided lower limit of new_accuracy - champion_accuracy
    high: float  # the one-sided upper limit
    margin: float  # the gain the new model must be shown to exceed
    smallest_shown: float | None  # the least observed gain that would clear the margin here

    @property
    def difference(self) -> float:
        return self.new_accuracy - self.champion_accuracy

    @property
    def verdict(self) -> Verdict:
        """``better`` (the lower limit clears the margin), ``worse`` (the upper limit is below
        zero), else ``not shown``."""
        if self.low > self.margin:
            return "better"
        if self.high < 0:
            return "worse"
        return "not shown"

    def sentence(self) -> str:
        """The comparison in one readable sentence, with its verdict."""
        alpha = 1 - self.confidence
        least = (
            f"{self.smallest_shown:+.4f}"
            if self.smallest_shown is not None
            else "none (too few images disagree)"
        )
        return (
            f"test accuracy {self.new_accuracy:.4f} against the champion's "
            f"{self.champion_accuracy:.4f} on the same {self.num_images} images: "
            f"{self.difference:+.4f}; {self.only_new} images only this version gets right, "
            f"{self.only_champion} only the champion; the gain is at least {self.low:+.4f} and "
            f"at most {self.high:+.4f} (one-sided {self.confidence:.2%} score limits, "
            f"alpha {alpha:.4g}); margin {self.margin:g}: {self.verdict} (the smallest gain "
            f"these images could show above the margin: {least})"
        )


def compare(
    new: np.ndarray, champion: np.ndarray, alpha: float, margin: float = 0.0
) -> PairedComparison:
    """Compare per-image correctness vectors (booleans, the same images in the same order);
    each one-sided limit has confidence ``1 - alpha``.

    Raises:
        ValueError: The vectors differ in length (not the same images) or are empty, or alpha
            is not in (0, 1).
    """
    new, champion = np.asarray(new, dtype=bool), np.asarray(champion, dtype=bool)
    if new.shape != champion.shape or new.ndim != 1 or new.size == 0:
        raise ValueError(
            f"Per-image results of {new.shape} and {champion.shape} images: a paired test "
            "needs both models scored on the same, non-empty test split."
        )
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha:g} must be between 0 and 1 (e.g. 0.05)")
    n = int(new.size)
    b = int(np.sum(new & ~champion))
    c = int(np.sum(~new & champion))
    confidence = 1 - alpha
    return PairedComparison(
        num_images=n,
        new_accuracy=float(new.mean()),
        champion_accuracy=float(champion.mean()),
        only_new=b,
        only_champion=c,
        confidence=confidence,
        low=lower_bound(b, c, n, confidence),
        high=upper_bound(b, c, n, confidence),
        margin=margin,
        smallest_shown=smallest_shown(b + c, n, confidence, margin),
    )


def smallest_shown(discordant: int, n: int, confidence: float, margin: float) -> float | None:
    """The least observed gain ``(b - c) / n``, with ``b + c = discordant`` images on which the
    two models disagree, whose lower limit clears ``margin``; None if none does."""

    def clears(b: int) -> bool:
        return lower_bound(b, discordant - b, n, confidence) > margin

    if not clears(discordant):
        return None
    lo, hi = (discordant - 1) // 2, discordant  # clears(hi); the lower limit grows with b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if clears(mid) else (mid, hi)
    return (2 * hi - discordant) / n
