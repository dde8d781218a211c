"""Promotion: does a new version take ``@champion``, on evidence, measured like with like?

The new version and the champion are compared image by image on the same test split (the
current run's, named by its digest; ``tasks.evaluate.champion_score`` scores the champion on it
once and stores its per-image results). The new version is promoted only if it is better by
a paired test (``tasks.paired_test``: McNemar's exact test, significant at ``alpha``) and by
more than ``margin``. A version trained on synthetic data never replaces one trained on real
data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.transactions import Transaction, get_transaction

from tasks.paired_test import compare
from tasks.registry import ALIASES, CHALLENGER, CHAMPION, version_at_alias
from tasks.retrying import TRANSIENT_RETRIES

logger = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.05  # the significance level a promotion needs (promote_alpha)


@dataclass(frozen=True)
class Promotion:
    """The promotion decision for one model version."""

    version: str
    alias: str
    promoted: bool
    reason: str


@dataclass(frozen=True)
class ChampionScore:
    """The champion measured on the current run's test split (``test_digest``)."""

    version: str
    accuracy: float
    correct: np.ndarray  # per test image (in the split's order): classified correctly
    test_digest: str
    data_digest: str | None  # what it was trained on (None: registered before lineage)
    synthetic: bool


def promote(
    model_name: str,
    version: str,
    correct: np.ndarray,
    margin: float,
    tracking_uri: str,
    *,
    alpha: float = DEFAULT_ALPHA,
    champion: ChampionScore | None = None,
    synthetic: bool = False,
) -> Promotion:
    """Give ``version`` (``correct``: its per-image results on the champion's test split) the
    champion alias if it beats ``champion`` significantly at ``alpha`` and by more than
    ``margin``; otherwise it becomes the challenger (``decide``).

    The reason is recorded on the version (before an alias moves: the alias is the last change,
    so a failure leaves every alias where it was).
    """
    client = MlflowClient(tracking_uri)
    promoted, reason = decide(correct, margin, alpha, champion, synthetic)
    alias = CHAMPION if promoted else CHALLENGER
    client.set_model_version_tag(model_name, version, "promotion", f"@{alias}: {reason}")
    client.set_registered_model_alias(model_name, alias, version)
    logger.info("%s version %s -> @%s (%s)", model_name, version, alias, reason)
    return Promotion(version, alias, promoted, reason)


def decide(
    correct: np.ndarray,
    margin: float,
    alpha: float,
    champion: ChampionScore | None,
    synthetic: bool,
) -> tuple[bool, str]:
    """Whether a version with per-image results ``correct`` replaces ``champion``, and why,
    in a sentence: only if a paired test finds it better at significance level ``alpha`` and
    its accuracy is higher by more than ``margin``."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"promote_alpha={alpha:g} must be between 0 and 1 (e.g. 0.05)")
    if champion is None:
        return True, "no champion yet"
    if synthetic and not champion.synthetic:
        return False, (
            f"trained on synthetic data: never promoted over champion version "
            f"{champion.version}, trained on real data"
        )
    comparison = compare(correct, champion.correct, alpha)
    significant = comparison.p_value < alpha
    promoted = significant and comparison.difference > margin
    if promoted:
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


@task(name="promote", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def promote_task(
    model_name: str,
    version: str,
    correct: np.ndarray,
    margin: float,
    alpha: float,
    tracking_uri: str,
    champion: ChampionScore | None,
    synthetic: bool,
) -> Promotion:
    """Promote or not, and say why in a Prefect artifact; in a transaction, a rollback puts
    the aliases back where they were."""
    if (txn := get_transaction()) is not None:
        txn.set("aliases", (model_name, aliases_of(model_name, tracking_uri), tracking_uri))
    promoted, reason = decide(correct, margin, alpha, champion, synthetic)
    alias = CHAMPION if promoted else CHALLENGER
    create_markdown_artifact(  # first: the alias is the transaction's last change
        key="promotion",
        markdown=(
            f"# {model_name} version {version}: @{alias}\n\n"
            f"{'Promoted' if promoted else 'Not promoted'}: {reason}."
        ),
        description="Promotion decision",
    )
    return promote(
        model_name,
        version,
        correct,
        margin,
        tracking_uri,
        alpha=alpha,
        champion=champion,
        synthetic=synthetic,
    )


@promote_task.on_rollback
def _restore_aliases(txn: Transaction) -> None:
    model_name, aliases, tracking_uri = txn.get("aliases")
    restore_aliases(model_name, aliases, tracking_uri)
