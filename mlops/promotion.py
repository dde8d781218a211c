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
(``decide``) and applied (``promote``) only if ``@champion`` is still where it assumed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from mlflow.tracking import MlflowClient
from scipy.stats import binomtest

from cifar.errors import InvalidParameterError
from mlops import ledger
from mlops.evaluation import ChampionScore, Evaluation
from mlops.model_card import DataFacts, model_card
from mlops.paired_test import PairedComparison, compare
from mlops.registry import version_at_alias
from mlops.release_gates import (
    DEFAULT_MAX_CLASS_DROP,
    DEFAULT_MIN_TEST_ACCURACY,
    Gate,
    accuracy_floor,
    class_drop,
)
from mlops.version_tags import ALIASES, CHALLENGER, CHAMPION, PROMOTION_TAG

logger = logging.getLogger(__name__)

# a first version must be shown this much better than always answering the most frequent class
FIRST_VERSION_MARGIN = 0.05
CODE_TAGS = ("git_sha", "torch_version")  # the training run's tags the model card quotes


class ChampionMoved(RuntimeError):
    """``@champion`` moved after the decision was made (another publish): decide again."""


@dataclass(frozen=True)
class Decision:
    """What becomes of one version, and why (made once; ``promote`` applies it)."""

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
class Promotion:
    """The promotion decision for one model version, applied."""

    version: str
    alias: str
    promoted: bool
    reason: str


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


def promote(
    model_name: str,
    version: str,
    evaluation: Evaluation,
    rule: PromotionRule,
    tracking_uri: str,
    *,
    champion: ChampionScore | None = None,
    synthetic: bool = False,
    data: DataFacts | None = None,
    recipe: str = "",
) -> Promotion:
    """Judge ``version`` (``judge``) and apply the decision (``apply_decision``)."""
    decision, gates = judge(
        model_name, version, evaluation, rule, tracking_uri, champion, synthetic
    )
    return apply_decision(
        model_name,
        version,
        evaluation,
        decision,
        tracking_uri,
        gates=gates,
        champion=champion,
        data=data,
        recipe=recipe,
    )


def apply_decision(
    model_name: str,
    version: str,
    evaluation: Evaluation,
    decision: Decision,
    tracking_uri: str,
    *,
    gates: tuple[Gate, ...] = (),
    champion: ChampionScore | None = None,
    data: DataFacts | None = None,
    recipe: str = "",
) -> Promotion:
    """Apply ``decision`` to ``version``: its comparison in the ledger, each gate's outcome and
    the reason on the version, its model card (``mlops.model_card``; ``data``: what it learnt
    from), then the alias, last, so a failure leaves every alias where it was.

    Raises:
        ChampionMoved: ``@champion`` is no longer where the decision assumed (a concurrent
            publish moved it): nothing is applied; or the alias, read back right after it was
            moved, names another version; decide again.
    """
    client = MlflowClient(tracking_uri)
    _check_champion_unmoved(model_name, version, decision, tracking_uri)
    if decision.comparison is not None and decision.place is not None and champion is not None:
        c, place = decision.comparison, decision.place
        ledger.record(
            client,
            model_name,
            ledger.Entry(
                k=place.k,
                split=champion.test_digest,
                version=version,
                champion=champion.version,
                recipe=recipe,
                num_images=c.num_images,
                only_new=c.only_new,
                only_champion=c.only_champion,
                alpha=1 - c.confidence,
                low=c.low,
                high=c.high,
                verdict=c.verdict,
                split_number=place.split_number,
                carried=place.carried,
            ),
        )
    for gate in gates:
        outcome = f"{'passed' if gate.passed else 'failed'}: {gate.detail}"
        client.set_model_version_tag(model_name, version, f"gate/{gate.name}", outcome)
    alias = decision.alias
    client.set_model_version_tag(model_name, version, PROMOTION_TAG, f"@{alias}: {decision.reason}")
    run_id = client.get_model_version(model_name, version).run_id
    run = client.get_run(run_id) if run_id else None
    card = model_card(
        model_name,
        version,
        alias,
        f"{'Promoted' if decision.promoted else 'Not promoted'}: {decision.reason}",
        data=data,
        params=run.data.params if run else {},
        code={key: run.data.tags[key] for key in CODE_TAGS if run and key in run.data.tags},
        accuracy=evaluation.accuracy,
        per_class=evaluation.per_class_accuracy,
        champion_per_class=champion.per_class_accuracy if champion else None,
        gates=gates,
        comparison=decision.comparison,
        budget_left=decision.place.split_left if decision.place is not None else None,
    )
    client.update_model_version(model_name, version, description=card)
    _check_champion_unmoved(model_name, version, decision, tracking_uri)  # again, right before
    client.set_registered_model_alias(model_name, alias, version)
    now = version_at_alias(model_name, alias, tracking_uri)  # read back: nobody moved it since
    if now != version:
        raise ChampionMoved(
            f"@{alias} of {model_name} reads version {now} right after it was moved to version "
            f"{version}: something outside the publish queue moves aliases; judged again"
        )
    logger.info("%s version %s -> @%s (%s)", model_name, version, alias, decision.reason)
    return Promotion(version, alias, decision.promoted, decision.reason)


def _check_champion_unmoved(
    model_name: str, version: str, decision: Decision, tracking_uri: str
) -> None:
    """Raise ``ChampionMoved`` if ``@champion`` is not where ``decision`` was made."""
    if version_at_alias(model_name, CHAMPION, tracking_uri) != decision.champion:
        raise ChampionMoved(
            f"@champion of {model_name} moved after version {version} was judged against "
            f"version {decision.champion}: judged again"
        )


def aliases_of(model_name: str, tracking_uri: str) -> dict[str, str | None]:
    """Which version holds ``@champion`` and ``@challenger`` now (None: no version)."""
    return {alias: version_at_alias(model_name, alias, tracking_uri) for alias in ALIASES}


def restore_aliases(
    model_name: str, aliases: dict[str, str | None], tracking_uri: str, ours: str
) -> list[str]:
    """Put back where ``aliases_of`` found them the aliases that still hold ``ours`` (the
    version this publish moved them to); an alias someone moved since is theirs and stays.
    Returns the aliases put back."""
    client = MlflowClient(tracking_uri)
    restored = []
    for alias, version in aliases.items():
        if version_at_alias(model_name, alias, tracking_uri) != ours or version == ours:
            continue
        if version is not None:
            client.set_registered_model_alias(model_name, alias, version)
        else:
            client.delete_registered_model_alias(model_name, alias)
        restored.append(alias)
    return restored
