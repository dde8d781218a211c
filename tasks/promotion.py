"""The promote step: the decision (``mlops.promotion``) said in a Prefect artifact; in the
publishing transaction, a rollback puts the aliases back where they were."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.transactions import Transaction, get_transaction

from mlops.evaluation import ChampionScore, Evaluation
from mlops.model_card import DataFacts
from mlops.promotion import Promotion, PromotionRule, aliases_of, decide, promote, restore_aliases
from mlops.registry import CHALLENGER, CHAMPION
from tasks.retrying import TRANSIENT_RETRIES


@task(name="promote", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def promote_task(
    model_name: str,
    version: str,
    evaluation: Evaluation,
    rule: PromotionRule,
    tracking_uri: str,
    champion: ChampionScore | None,
    synthetic: bool,
    data: DataFacts | None = None,
) -> Promotion:
    """Promote or not, and say why in a Prefect artifact; in a transaction, a rollback puts
    the aliases back where they were."""
    if (txn := get_transaction()) is not None:
        txn.set("aliases", (model_name, aliases_of(model_name, tracking_uri), tracking_uri))
    gates = rule.gates(evaluation, champion)
    promoted, reason = decide(evaluation.correct, rule, champion, synthetic, gates)
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
        evaluation,
        rule,
        tracking_uri,
        champion=champion,
        synthetic=synthetic,
        data=data,
    )


@promote_task.on_rollback
def _restore_aliases(txn: Transaction) -> None:
    model_name, aliases, tracking_uri = txn.get("aliases")
    restore_aliases(model_name, aliases, tracking_uri)
