"""Promotion: does a new version take ``@champion``, on evidence, measured like with like?

The new version and the champion are compared image by image on the same test split (the
current run's, named by its digest; ``mlops.evaluation.champion_score`` scores the champion on it
once and stores its per-image results). The new version is promoted only if it is better by
a paired test (``mlops.paired_test``: McNemar's exact test, significant at ``alpha``) and by
more than ``margin``. A version trained on synthetic data never replaces one trained on real
data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from mlflow.tracking import MlflowClient

from mlops.evaluation import ChampionScore, Evaluation
from mlops.model_card import DataFacts, model_card
from mlops.paired_test import compare
from mlops.registry import ALIASES, CHALLENGER, CHAMPION, PROMOTION_TAG, version_at_alias
from mlops.release_gates import (
    DEFAULT_MAX_CLASS_DROP,
    DEFAULT_MIN_TEST_ACCURACY,
    Gate,
    accuracy_floor,
    class_drop,
)

logger = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.05  # the significance level a promotion needs (promote_alpha)
CODE_TAGS = ("git_sha", "torch_version")  # the training run's tags the model card quotes


@dataclass(frozen=True)
class Promotion:
    """The promotion decision for one model version."""

    version: str
    alias: str
    promoted: bool
    reason: str


@dataclass(frozen=True)
class PromotionRule:
    """What a new version must show to take ``@champion`` (the flows' parameters)."""

    margin: float = 0.0  # promote_margin: accuracy above the champion's, at least
    alpha: float = DEFAULT_ALPHA  # promote_alpha: the paired test's significance level
    min_test_accuracy: float = DEFAULT_MIN_TEST_ACCURACY
    max_class_drop: float = DEFAULT_MAX_CLASS_DROP
    check_fresh_load: bool = True  # the gate fresh_load (the evaluation runs it)

    def gates(self, evaluation: Evaluation, champion: ChampionScore | None) -> tuple[Gate, ...]:
        """The release gates' outcomes for ``evaluation`` against ``champion``."""
        champion_classes = champion.per_class_accuracy if champion is not None else None
        found = (
            accuracy_floor(evaluation.accuracy, self.min_test_accuracy),
            class_drop(evaluation.per_class_accuracy, champion_classes, self.max_class_drop),
        )
        return found if evaluation.fresh_load is None else (*found, evaluation.fresh_load)


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
) -> Promotion:
    """Give ``version`` (``evaluation``: on the champion's test split) the champion alias if it
    passes the release gates and beats ``champion`` as ``rule`` asks; otherwise it becomes the
    challenger (``decide``).

    Each gate's outcome and the reason are recorded on the version, and its description becomes
    its model card (``mlops.model_card``; ``data``: what it learnt from), before an alias
    moves: the alias is the last change, so a failure leaves every alias where it was.
    """
    client = MlflowClient(tracking_uri)
    gates = rule.gates(evaluation, champion)
    for gate in gates:
        outcome = f"{'passed' if gate.passed else 'failed'}: {gate.detail}"
        client.set_model_version_tag(model_name, version, f"gate/{gate.name}", outcome)
    promoted, reason = decide(evaluation.correct, rule, champion, synthetic, gates)
    alias = CHAMPION if promoted else CHALLENGER
    client.set_model_version_tag(model_name, version, PROMOTION_TAG, f"@{alias}: {reason}")
    run_id = client.get_model_version(model_name, version).run_id
    run = client.get_run(run_id) if run_id else None
    card = model_card(
        model_name,
        version,
        alias,
        f"{'Promoted' if promoted else 'Not promoted'}: {reason}",
        data=data,
        params=run.data.params if run else {},
        code={key: run.data.tags[key] for key in CODE_TAGS if run and key in run.data.tags},
        accuracy=evaluation.accuracy,
        per_class=evaluation.per_class_accuracy,
        champion_per_class=champion.per_class_accuracy if champion else None,
        gates=gates,
    )
    client.update_model_version(model_name, version, description=card)
    client.set_registered_model_alias(model_name, alias, version)
    logger.info("%s version %s -> @%s (%s)", model_name, version, alias, reason)
    return Promotion(version, alias, promoted, reason)


def decide(
    correct: np.ndarray,
    rule: PromotionRule,
    champion: ChampionScore | None,
    synthetic: bool,
    gates: tuple[Gate, ...] = (),
) -> tuple[bool, str]:
    """Whether a version with per-image results ``correct`` replaces ``champion``, and why,
    in a sentence: only if it passed every release gate, a paired test finds it better at
    significance level ``rule.alpha`` and its accuracy is higher by more than ``rule.margin``."""
    margin, alpha = rule.margin, rule.alpha
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"promote_alpha={alpha:g} must be between 0 and 1 (e.g. 0.05)")
    failed = "; ".join(
        f"failed the release gate {g.name}: {g.detail}" for g in gates if not g.passed
    )
    if champion is None:
        return (False, f"{failed}; no champion yet") if failed else (True, "no champion yet")
    if synthetic and not champion.synthetic:
        return False, (
            f"trained on synthetic data: never promoted over champion version "
            f"{champion.version}, trained on real data"
        )
    comparison = compare(correct, champion.correct, alpha)
    significant = comparison.p_value < alpha
    promoted = significant and comparison.difference > margin and not failed
    if failed:
        verdict = failed
    elif promoted:
        verdict = f"significant at alpha {alpha:g} and above the margin {margin:g}: promoted"
    elif significant:
        verdict = f"significant at alpha {alpha:g} but not above the margin {margin:g}"
    else:
        verdict = f"not significant at alpha {alpha:g}"
    where = f"test split {champion.test_digest}"
    if champion.data_digest is not None:
        where += f"; champion trained on dataset {champion.data_digest}"
    if not promoted:
        verdict += f": champion version {champion.version} stays"
    return promoted, f"{comparison.sentence()}: {verdict} ({where})"


def aliases_of(model_name: str, tracking_uri: str) -> dict[str, str | None]:
    """Which version holds ``@champion`` and ``@challenger`` now (None: no version)."""
    return {alias: version_at_alias(model_name, alias, tracking_uri) for alias in ALIASES}


def restore_aliases(model_name: str, aliases: dict[str, str | None], tracking_uri: str) -> None:
    """Put the aliases back where ``aliases_of`` found them."""
    client = MlflowClient(tracking_uri)
    for alias, version in aliases.items():
        if version is not None:
            client.set_registered_model_alias(model_name, alias, version)
        elif version_at_alias(model_name, alias, tracking_uri) is not None:
            client.delete_registered_model_alias(model_name, alias)
