"""The promote step: the decision (``mlops.promotion``), said in a Prefect artifact each time it
is made, applied if ``@champion`` is still where it assumed, else judged again against the new
champion (``mlops.alias_moves.promote``); in the publishing transaction, a rollback puts back
the aliases this publish moved (one someone moved since is left where they put it)."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.transactions import Transaction, get_transaction

from cifar.dataset import Dataset
from mlops.alias_moves import Promotion, aliases_of, promote, restore_aliases
from mlops.evaluation import ChampionScore, Evaluation, champion_score
from mlops.model_card import data_facts
from mlops.promotion import Decision, PromotionRule
from tasks.retrying import TRANSIENT_RETRIES


@task(name="promote", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def promote_task(
    model_name: str,
    version: str,
    evaluation: Evaluation,
    rule: PromotionRule,
    tracking_uri: str,
    champion: ChampionScore | None,
    dataset: Dataset,
    recipe: str = "",
) -> Promotion:
    """Promote or not, and say why in a Prefect artifact; in a transaction, a rollback puts
    the aliases back where they were."""
    if (txn := get_transaction()) is not None:
        txn.set(
            "aliases", (model_name, aliases_of(model_name, tracking_uri), tracking_uri, version)
        )

    def said(decision: Decision) -> None:  # first: the alias is the transaction's last change
        create_markdown_artifact(
            key="promotion",
            markdown=(
                f"# {model_name} version {version}: @{decision.alias}\n\n"
                f"{'Promoted' if decision.promoted else 'Not promoted'}: {decision.reason}."
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
        rescore=lambda: champion_score(model_name, dataset, tracking_uri),
        synthetic=dataset.manifest.synthetic,
        data=data_facts(dataset),
        recipe=recipe,
        on_decision=said,
    )


@promote_task.on_rollback
def _restore_aliases(txn: Transaction) -> None:
    model_name, aliases, tracking_uri, version = txn.get("aliases")
    restore_aliases(model_name, aliases, tracking_uri, ours=version)
