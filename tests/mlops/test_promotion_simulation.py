"""The promotion rule over a model's life, simulated on per-image results (seeded, fast).

Per-image difficulty, as test sets have it: most images are easy (right 99.5% of the time),
a few are hopeless (2%), and the rest are ambiguous (right with a probability drawn uniformly
between 0.1 and 0.9): 95% accuracy, and two equally good models disagree on about 2.4% of the
images, as two training runs of a good CIFAR-10 classifier do ("churn" of a few percent). A
candidate with a real gain gets the ambiguous images right more often. (Power falls as churn
grows: docs/mlops.md has the table.)

- Equally good candidates, 100 of them, each compared with the champion on the same split as
  the ledger spends alpha (the k-th at alpha·6/(π²k²)), margin 0: the chance that any of them
  is promoted (a false promotion in the model's life) is at most promote_alpha.
- A candidate better by twice the nightly's margin (+0.010 against 0.005), first on its split,
  on 10,000 images: promoted at least 80% of the time.
"""

from __future__ import annotations

import numpy as np

from mlops.evaluation import ChampionScore, Evaluation
from mlops.ledger import alpha_spent
from mlops.paired_test import lower_bound
from mlops.promotion import PromotionRule, decide

ALPHA, MARGIN = 0.05, 0.005
LIVES, CANDIDATES, LIFE_IMAGES = 1000, 100, 1000
POWER_RUNS, POWER_IMAGES, GAIN = 300, 10_000, 2 * MARGIN


def difficulty(rng: np.random.Generator, n: int) -> np.ndarray:
    """Each image's chance to be classified right by a model of the champion's quality."""
    kind = rng.random(n)
    ambiguous = rng.uniform(0.1, 0.9, n)
    return np.where(kind < 0.94, 0.995, np.where(kind < 0.965, 0.02, ambiguous))


def better_by(p: np.ndarray, gain: float) -> np.ndarray:
    """A model right more often on the ambiguous images (each a share ``t`` of the way from
    its chance to certainty), ``gain`` more accurate overall."""
    ambiguous = (p > 0.05) & (p < 0.99)
    t = gain * len(p) / float(np.sum(1 - p[ambiguous]))
    return np.where(ambiguous, p + t * (1 - p), p)


def promoted(new: np.ndarray, champion: np.ndarray, k: int, margin: float) -> bool:
    """The rule's verdict (the lower limit at 1 - alpha_spent(k) above the margin)."""
    b, c = int(np.sum(new & ~champion)), int(np.sum(~new & champion))
    n = len(new)
    if b - c <= n * margin + 1:  # the limit is below the observed gain: cannot clear it
        return False
    return lower_bound(b, c, n, 1 - alpha_spent(k, ALPHA)) > margin


def test_simulation_lifetime_false_promotions_stay_within_alpha() -> None:
    rng = np.random.default_rng(20261127)
    p = difficulty(rng, LIFE_IMAGES)
    falsely = 0
    for _ in range(LIVES):
        champion = rng.random(LIFE_IMAGES) < p
        for k in range(1, CANDIDATES + 1):
            if promoted(rng.random(LIFE_IMAGES) < p, champion, k, margin=0.0):
                falsely += 1
                break
    rate = falsely / LIVES
    assert rate <= ALPHA, f"{falsely} of {LIVES} lives had a false promotion"
    # Each comparison at the full alpha instead would promote one of the 100 in most lives.
    assert rate > 0, "the simulation must be able to make a false promotion at all"


def test_simulation_a_gain_of_twice_the_margin_is_shown_80_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    p = difficulty(rng, POWER_IMAGES)
    q = better_by(p, GAIN)
    assert abs((q.mean() - p.mean()) - GAIN) < 1e-9
    shown = sum(
        promoted(rng.random(POWER_IMAGES) < q, rng.random(POWER_IMAGES) < p, 1, MARGIN)
        for _ in range(POWER_RUNS)
    )
    assert shown / POWER_RUNS >= 0.80, f"shown {shown} of {POWER_RUNS} times"


def test_simulation_shortcut_agrees_with_the_rule() -> None:
    """``promoted`` (the simulation's) and ``decide`` (the pipeline's) agree."""
    rng = np.random.default_rng(3)
    p = difficulty(rng, 1000)
    for k in (1, 2, 5):
        for _ in range(40):
            champion, new = rng.random(1000) < p, rng.random(1000) < better_by(p, 0.02)
            evaluation = Evaluation(float(new.mean()), {}, [[1000]], 1000, new)
            score = ChampionScore("1", float(champion.mean()), champion, {}, "t", None, False)
            decision = decide(evaluation, PromotionRule(MARGIN, ALPHA), score, False, (), k)
            assert decision.promoted is promoted(new, champion, k, MARGIN)
