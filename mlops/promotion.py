"""Promotion: does a new version take ``@champion``, on evidence, measured like with like?

The new version and the champion are compared image by image on the same test split (the
current run's, named by its digest; ``mlops.evaluation.champion_score`` scores the champion on it
once and stores its per-image results). The new version is promoted only if it passes the
release gates and the one-sided lower confidence limit of its accuracy gain clears ``margin``
(``mlops.paired_test``), at the alpha this comparison may spend from the registered model's
lifetime budget, fixed at its first judgement and kept with its ledger in the registry
(``mlops.ledger``), so the chance of any false promotion over the model's life stays at most
that alpha. A first version must be shown better than chance by ``FIRST_VERSION_MARGIN``
(a binomial test against the majority class's rate plus the margin). A version trained on
synthetic data never replaces one trained on real data. The decision is made once
(``judge``); ``mlops.alias_moves`` applies it only if ``@champion`` is still where it assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mlflow.tracking import MlflowClient
from scipy.stats import binomtest

from cifar.errors import InvalidParameterError
from mlops import ledger
from mlops.evaluation import ChampionScore, Evaluation
from mlops.paired_test import PairedComparison, compare
from mlops.release_gates import (
    DEFAULT_MAX_CLASS_DROP,
    DEFAULT_MIN_TEST_ACCURACY,
    Gate,
    accuracy_floor,
    class_drop,
)
from mlops.version_tags import CHALLENGER, CHAMPION

# a first version must be shown this much better than always answering the most frequent class
FIRST_VERSION_MARGIN = 0.05


@dataclass(frozen=True)
class Decision:
    """What becomes of one version, and why (made once; ``mlops.alias_moves`` applies it)."""

    promoted: bool
    reason: str  # one sentence, with the figures
    champion: str | None  # the version it was judged against (None: there was none)
    comparison: PairedComparison | None = None  # against the champion, when there was one
    place: ledger.Place | None = None  # the comparison's place in the model's budget
    alpha: float = ledger.DEFAULT_ALPHA  # the model's lifetime budget it was judged under

    @property
    def alias(self) -> str:
        return CHAMPION if self.promoted else CHALLENGER


@dataclass(frozen=True)
class PromotionRule:
    """What a new version must show to take ``@champion`` (the flows' parameters)."""

    margin: float = 0.0  # promote_margin: the gain the lower confidence limit must clear
    # promote_alpha: the registered model's lifetime false-promotion budget, taken only by
    # its first judgement (None: the model's, or ledger.DEFAULT_ALPHA for a new model)
    alpha: float | None = None
    min_test_accuracy: float = DEFAULT_MIN_TEST_ACCURACY
    max_class_drop: float = DEFAULT_MAX_CLASS_DROP
    check_fresh_load: bool = True  # the gate fresh_load (the evaluation runs it)

    def __post_init__(self) -> None:
        """The parameters' one check: the flows make the rule before anything is downloaded.

        Raises:
            InvalidParameterError: A parameter no promotion could work with.
        """
        if self.alpha is not None and not 0.0 < self.alpha < 1.0:
            raise InvalidParameterError(
                f"promote_alpha={self.alpha:g} must be between 0 and 1 (e.g. 0.05)"
            )
        if not (0.0 <= self.margin < 1.0 and 0.0 <= self.min_test_accuracy <= 1.0):
            raise InvalidParameterError(
                f"promote_margin={self.margin:g} must be at least 0 and below 1 (the accuracy gain "
                "a new version must be shown to exceed: below 0 a worse model would be promoted "
                f"as better) and min_test_accuracy={self.min_test_accuracy:g} between 0 and 1"
            )
        if not 0.0 <= self.max_class_drop <= 1.0:
            raise InvalidParameterError(
                f"max_class_drop={self.max_class_drop:g} must be between 0 and 1 (e.g. 0.04; "
                "1 turns the gate off)"
            )

    def gates(
        self, evaluation: Evaluation, champion: ChampionScore | None, alpha: float
    ) -> tuple[Gate, ...]:
        """The release gates' outcomes for ``evaluation`` against ``champion``, under the
        model's lifetime ``alpha``."""
        found = (
            accuracy_floor(evaluation.accuracy, self.min_test_accuracy),
            class_drop(
                evaluation.correct,
                champion.correct if champion is not None else None,
                evaluation.labels,
                list(evaluation.per_class_accuracy),
                self.max_class_drop,
                alpha,
            ),
        )
        return found if evaluation.fresh_load is None else (*found, evaluation.fresh_load)


def decide(
    evaluation: Evaluation,
    rule: PromotionRule,
    champion: ChampionScore | None,
    synthetic: bool,
    gates: tuple[Gate, ...] = (),
    place: ledger.Place | None = None,
    alpha: float = ledger.DEFAULT_ALPHA,
) -> Decision:
    """Whether a version replaces ``champion``, and why, in a sentence: only if it passed every
    release gate and, at its ``place`` in the model's budget ``alpha`` (the first comparison on
    a first split if None), its gain's lower limit at ``1 - place.alpha`` clears
    ``rule.margin``; with no champion, only if it is shown better than chance by
    ``FIRST_VERSION_MARGIN``."""
    failed = "; ".join(
        f"failed the release gate {g.name}: {g.detail}" for g in gates if not g.passed
    )
    if champion is None:
        chance = _better_than_chance(evaluation, alpha)
        promoted = chance.startswith("better") and not failed
        reason = "; ".join(part for part in (failed, chance, "no champion yet") if part)
        return Decision(promoted, reason, None, alpha=alpha)
    if synthetic and not champion.synthetic:
        return Decision(
            False,
            f"trained on synthetic data: never promoted over champion version "
            f"{champion.version}, trained on real data",
            champion.version,
            alpha=alpha,
        )
    if place is None:
        place = ledger.next_place((), champion.test_digest, "", alpha)
    comparison = compare(evaluation.correct, champion.correct, place.alpha, rule.margin)
    promoted = comparison.verdict == "better" and not failed
    carried = (
        f" + {place.carried:.4g} passed on by the promotion before it" if place.carried else ""
    )
    budget = (
        f"comparison {place.k} on test split {place.split_number} of this model, alpha "
        f"{place.alpha:.4g} (its share {place.share:.4g} of the model's lifetime {alpha:g}"
        f"{carried}; left on this split for later ones: {place.split_left:.4g})"
    )
    outcome = "promoted" if promoted else f"champion version {champion.version} stays"
    verdict = f"{failed}: {outcome}" if failed else outcome
    where = f"test split {champion.test_digest}"
    if champion.data_digest is not None:
        where += f"; champion trained on dataset {champion.data_digest}"
    return Decision(
        promoted,
        f"{comparison.sentence()}; {budget}: {verdict} ({where})",
        champion.version,
        comparison,
        place,
        alpha,
    )


def _better_than_chance(evaluation: Evaluation, alpha: float) -> str:
    """Whether the accuracy beats always answering the most frequent class by more than
    ``FIRST_VERSION_MARGIN``, by an exact one-sided binomial test at ``alpha``: a sentence
    starting "better" or "not better"."""
    confusion = np.asarray(evaluation.confusion, dtype=np.int64)
    counts = confusion.sum(axis=1) if confusion.ndim == 2 else np.array([evaluation.num_images])
    n = int(counts.sum())
    majority = float(counts.max() / n) if n else 1.0
    floor = majority + FIRST_VERSION_MARGIN
    right = int(np.sum(evaluation.correct))
    p = binomtest(right, n, floor, alternative="greater").pvalue if n and floor < 1 else 1.0
    relation = "better" if p < alpha else "not better"
    return (
        f"{relation} than chance: test accuracy {evaluation.accuracy:.4f} against the most "
        f"frequent class's rate {majority:.4f} plus {FIRST_VERSION_MARGIN:g} (exact binomial "
        f"test, one-sided p={p:.3g}, alpha {alpha:g})"
    )


def judge(
    model_name: str,
    version: str,
    evaluation: Evaluation,
    rule: PromotionRule,
    tracking_uri: str,
    champion: ChampionScore | None,
    synthetic: bool,
) -> tuple[Decision, tuple[Gate, ...]]:
    """The decision for ``version`` of ``model_name`` (``decide``) under the model's budget
    (fixed now if this is its first judgement), at its place in the ledger (the next one, or
    the one a first try recorded), and the release gates' outcomes it used.

    Raises:
        InvalidParameterError: ``rule.alpha`` is not the model's budget.
    """
    client = MlflowClient(tracking_uri)
    alpha = ledger.budget(client, model_name, version, rule.alpha).alpha
    gates = rule.gates(evaluation, champion, alpha)
    place = None
    if champion is not None:
        place = ledger.place_of(client, model_name, champion.test_digest, version, alpha)
    return decide(evaluation, rule, champion, synthetic, gates, place, alpha), gates
