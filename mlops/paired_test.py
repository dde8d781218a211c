"""Is a new model better than the champion, or only luckier? A paired test on the same images.

Both models are scored on the same test images, so the evidence is paired: what matters is the
images one gets right and the other wrong. McNemar's exact test asks whether the new model's
extra correct images (``only_new``) outnumber the champion's (``only_champion``) by more than
chance would: under "equally good" each such image is a fair coin, so the one-sided p-value is
P(X >= only_new) for X ~ Binomial(only_new + only_champion, 1/2) (scipy's ``binomtest``). The
difference of accuracies gets a paired (Wald) confidence interval. No Prefect, no MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest, norm


@dataclass(frozen=True)
class PairedComparison:
    """Two models' per-image correctness on the same test images, compared."""

    num_images: int
    new_accuracy: float
    champion_accuracy: float
    only_new: int  # images only the new model classifies correctly
    only_champion: int  # images only the champion classifies correctly
    p_value: float  # one-sided exact McNemar: the new model is better
    confidence: float  # of the interval, e.g. 0.95
    low: float  # the interval of new_accuracy - champion_accuracy
    high: float

    @property
    def difference(self) -> float:
        return self.new_accuracy - self.champion_accuracy

    def sentence(self) -> str:
        """The comparison in one readable sentence (no verdict)."""
        return (
            f"test accuracy {self.new_accuracy:.4f} against the champion's "
            f"{self.champion_accuracy:.4f} on the same {self.num_images} images: "
            f"{self.difference:+.4f} ({self.confidence:.0%} CI {self.low:+.4f} to "
            f"{self.high:+.4f}); {self.only_new} images only this version gets right, "
            f"{self.only_champion} only the champion; McNemar's exact test (one-sided) "
            f"p={self.p_value:.3g}"
        )


def compare(new: np.ndarray, champion: np.ndarray, alpha: float) -> PairedComparison:
    """Compare per-image correctness vectors (booleans, the same images in the same order);
    the interval's confidence is ``1 - alpha``.

    Raises:
        ValueError: The vectors differ in length (not the same images) or are empty.
    """
    new, champion = np.asarray(new, dtype=bool), np.asarray(champion, dtype=bool)
    if new.shape != champion.shape or new.ndim != 1 or new.size == 0:
        raise ValueError(
            f"Per-image results of {new.shape} and {champion.shape} images: a paired test "
            "needs both models scored on the same, non-empty test split."
        )
    n = new.size
    only_new = int(np.sum(new & ~champion))
    only_champion = int(np.sum(~new & champion))
    discordant = only_new + only_champion
    p_value = (
        binomtest(only_new, discordant, 0.5, alternative="greater").pvalue if discordant else 1.0
    )
    difference = (only_new - only_champion) / n
    spread = math.sqrt(max(discordant - (only_new - only_champion) ** 2 / n, 0.0)) / n
    z = float(norm.ppf(1 - alpha / 2))
    return PairedComparison(
        num_images=n,
        new_accuracy=float(new.mean()),
        champion_accuracy=float(champion.mean()),
        only_new=only_new,
        only_champion=only_champion,
        p_value=float(p_value),
        confidence=1 - alpha,
        low=difference - z * spread,
        high=difference + z * spread,
    )
