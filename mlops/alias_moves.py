"""Applying a promotion decision to the registry: the version's record (ledger entry, gates,
reason, model card), then the alias, last, and only while ``@champion`` is where the decision
assumed; a champion moved by a concurrent publish gets the version judged again
(``promote``). A rollback puts back the aliases a publish moved (``restore_aliases``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from mlflow.tracking import MlflowClient

from mlops import ledger
from mlops.evaluation import ChampionScore, Evaluation
from mlops.model_card import DataFacts, model_card
from mlops.promotion import Decision, PromotionRule, judge
from mlops.registry import version_at_alias
from mlops.release_gates import Gate
from mlops.version_tags import ALIASES, CHAMPION, PROMOTION_TAG

logger = logging.getLogger(__name__)

CODE_TAGS = ("git_sha", "torch_version")  # the training run's tags the model card quotes
JUDGEMENTS = 3  # a champion that moves this often while one version is judged: ChampionMoved


class ChampionMoved(RuntimeError):
    """``@champion`` moved after the decision was made (another publish): decide again."""


@dataclass(frozen=True)
class Promotion:
    """The promotion decision for one model version, applied."""

    version: str
    alias: str
    promoted: bool
    reason: str


def promote(
    model_name: str,
    version: str,
    evaluation: Evaluation,
    rule: PromotionRule,
    tracking_uri: str,
    *,
    champion: ChampionScore | None = None,
    rescore: Callable[[], ChampionScore | None] = lambda: None,
    synthetic: bool = False,
    data: DataFacts | None = None,
    recipe: str = "",
    on_decision: Callable[[Decision], None] = lambda decision: None,
) -> Promotion:
    """Judge ``version`` against ``champion`` (``mlops.promotion.judge``), tell ``on_decision``,
    and apply the decision (``apply_decision``); while ``@champion`` moves under it, score the
    new champion (``rescore``; by default none is, and a moved champion ends in
    ``ChampionMoved``) and judge again, up to ``JUDGEMENTS`` times.

    Raises:
        ChampionMoved: ``@champion`` moved on every one of the ``JUDGEMENTS`` judgements.
    """
    for judgement in range(JUDGEMENTS):
        decision, gates = judge(
            model_name, version, evaluation, rule, tracking_uri, champion, synthetic
        )
        on_decision(decision)
        try:
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
        except ChampionMoved:
            if judgement == JUDGEMENTS - 1:
                raise
            champion = rescore()
    raise AssertionError("unreachable: the last judgement returns or raises")


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
