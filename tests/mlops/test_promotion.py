"""Promotion on a real MLflow sqlite store: like with like, synthetic apart, aliases restored."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from cifar.checkpoint import save_training_state
from cifar.dataset import Dataset, Manifest, content_digest, write_file, write_manifest
from cifar.format import CLASS_NAMES
from cifar.models import ModelSpec, build_model
from mlops import ledger
from mlops.alias_moves import (
    JUDGEMENTS,
    ChampionMoved,
    Promotion,
    aliases_of,
    apply_decision,
    promote,
    restore_aliases,
)
from mlops.evaluation import ChampionScore, Evaluation, champion_score, per_class_accuracy
from mlops.evidence import accuracy_tag, keep_evidence, read_evidence
from mlops.model_card import data_facts
from mlops.promotion import Decision, PromotionRule, judge
from mlops.registry import register_checkpoint, register_model
from mlops.tracking import start_run


def _register(tracking_uri: str, name: str) -> str:
    run_id = start_run(tracking_uri, "promotion-test", "run", {}, {})
    return register_model(
        build_model("small_cnn", (0.5,) * 3, (0.25,) * 3), run_id, name, tracking_uri
    )


def _correct(right: int, total: int = 1000) -> np.ndarray:
    """Per-image results: the first ``right`` of ``total`` test images classified correctly."""
    return np.arange(total) < right


LABELS = np.arange(1000) % 10  # the test images' classes: 100 of each


def _per_class(correct: np.ndarray) -> dict[str, float]:
    return per_class_accuracy(correct, LABELS[: len(correct)], CLASS_NAMES)


def _score(version: str, correct: np.ndarray, synthetic: bool = False) -> ChampionScore:
    accuracy = float(correct.mean())
    return ChampionScore(
        version, accuracy, correct, _per_class(correct), "t" * 16, "d" * 16, synthetic
    )


def _evaluation(correct: np.ndarray) -> Evaluation:
    """An evaluation with these per-image results (image i of class i % 10; a wrong one taken
    for the next class)."""
    labels = LABELS[: len(correct)]
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (labels, np.where(correct, labels, (labels + 1) % 10)), 1)
    return Evaluation(
        float(correct.mean()),
        _per_class(correct),
        confusion.tolist(),
        len(correct),
        correct,
        labels=labels,
    )


def _rule(margin: float = 0.0, **gates: float) -> PromotionRule:
    return PromotionRule(margin=margin, **gates)


def _images(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)


def _dataset(
    root: Path, seed: int, synthetic: bool = False, labels: np.ndarray | None = None
) -> Dataset:
    """20 random images as the test split (``labels``, else 0-9 twice), and 20 others as the
    train and val splits."""
    test_labels = np.arange(20) % 10 if labels is None else labels
    test = [write_file(str(root / "test-00000.parquet"), _images(seed), test_labels)]
    other = [write_file(str(root / "train-00000.parquet"), _images(seed + 100), np.arange(20) % 10)]
    splits = {"test": test, "train": other, "val": other}
    contents = {
        "test": content_digest(_images(seed), test_labels),
        "train": content_digest(_images(seed + 100), np.arange(20) % 10),
    }
    contents["val"] = contents["train"]
    manifest = Manifest(
        "md5", True, CLASS_NAMES, (0.5,) * 3, (0.25,) * 3, 0.1, 0, splits, synthetic, contents
    )
    write_manifest(str(root), manifest)
    return Dataset(str(root), manifest)


def test_promotion_first_version_becomes_champion(tracking_uri: str) -> None:
    version = _register(tracking_uri, "first")
    decision = promote(
        "first", version, _evaluation(_correct(500)), _rule(0.0), tracking_uri, champion=None
    )
    assert (decision.promoted, decision.alias) == (True, "champion")
    assert decision.reason.startswith(
        "better than chance: test accuracy 0.5000 against the most frequent class's rate "
        "0.1000 plus 0.05 (exact binomial test, one-sided p="
    )
    assert decision.reason.endswith(", alpha 0.05); no champion yet")
    assert aliases_of("first", tracking_uri) == {"champion": version, "challenger": None}


def test_promotion_needs_the_gains_lower_limit_above_the_margin(tracking_uri: str) -> None:
    champion = _register(tracking_uri, "duel")
    promote("duel", champion, _evaluation(_correct(800)), _rule(0.0), tracking_uri)
    # Right on the champion's 800 images and 10 more: a gain, but its lower limit is below 0.05.
    newcomer = _register(tracking_uri, "duel")
    decision = promote(
        "duel",
        newcomer,
        _evaluation(_correct(810)),
        _rule(0.05),
        tracking_uri,
        champion=_score(champion, _correct(800)),
    )
    assert (decision.promoted, decision.alias) == (False, "challenger")
    assert decision.reason.startswith(
        "test accuracy 0.8100 against the champion's 0.8000 on the same 1000 images: +0.0100; "
        "10 images only this version gets right, 0 only the champion; the gain is at least "
    )
    assert "margin 0.05: not shown" in decision.reason
    assert (
        "comparison 1 on test split 1 of this model, alpha 0.01848 (its share 0.3696 of the "
        "model's lifetime 0.05; left on this split for later ones: 0.01192)" in decision.reason
    )
    assert decision.reason.endswith(
        "champion version 1 stays (test split tttttttttttttttt; champion trained on dataset "
        "dddddddddddddddd)"
    )
    tag = MlflowClient(tracking_uri).get_model_version("duel", newcomer).tags["promotion"]
    assert tag == f"@challenger: {decision.reason}"
    better = _register(tracking_uri, "duel")
    promoted = promote(
        "duel",
        better,
        _evaluation(_correct(900)),
        _rule(0.05),
        tracking_uri,
        champion=_score(champion, _correct(800)),
    )
    assert promoted.promoted and "margin 0.05: better" in promoted.reason
    assert "comparison 2 on test split 1 of this model, alpha 0.00462 " in promoted.reason
    assert aliases_of("duel", tracking_uri) == {"champion": better, "challenger": newcomer}
    recorded = ledger.entries(MlflowClient(tracking_uri), "duel", "t" * 16)
    assert [(e.k, e.version, e.verdict) for e in recorded] == [
        (1, newcomer, "not shown"),
        (2, better, "better"),
    ]
    assert recorded[1].alpha == pytest.approx(0.05 * (6 / math.pi**2) ** 2 / 4)


def test_promotion_a_retried_promote_step_reuses_its_ledger_entry(tracking_uri: str) -> None:
    """The promote step retried after it recorded its comparison (its reply lost): judged at
    the same place with the same alpha, to the same verdict; no entry added, no alpha spent."""
    champion = _register(tracking_uri, "retried")
    promote("retried", champion, _evaluation(_correct(800)), _rule(), tracking_uri)
    score = _score(champion, _correct(800))
    newcomer = _register(tracking_uri, "retried")
    tries = [
        promote("retried", newcomer, _evaluation(_correct(805)), _rule(), tracking_uri,
                champion=score)
        for _ in range(3)
    ]  # fmt: skip
    assert len({(t.alias, t.reason) for t in tries}) == 1
    recorded = ledger.entries(MlflowClient(tracking_uri), "retried", "t" * 16)
    assert [(e.k, e.version) for e in recorded] == [(1, newcomer)]
    later = _register(tracking_uri, "retried")
    promote("retried", later, _evaluation(_correct(801)), _rule(), tracking_uri, champion=score)
    recorded = ledger.entries(MlflowClient(tracking_uri), "retried", "t" * 16)
    assert [(e.k, e.version) for e in recorded] == [(1, newcomer), (2, later)]


def test_promotion_synthetic_never_replaces_a_real_champion(tracking_uri: str) -> None:
    real = _register(tracking_uri, "mixed")
    promote("mixed", real, _evaluation(_correct(300)), _rule(0.0), tracking_uri)
    fake = _register(tracking_uri, "mixed")
    decision = promote(
        "mixed",
        fake,
        _evaluation(_correct(1000)),
        _rule(0.0),
        tracking_uri,
        champion=_score(real, _correct(300)),
        synthetic=True,
    )
    assert (decision.promoted, decision.alias) == (False, "challenger")
    assert "trained on synthetic data: never promoted over champion version 1" in decision.reason
    again = _register(tracking_uri, "mixed")
    synthetic_champion = _score(real, _correct(300), synthetic=True)
    assert promote(
        "mixed",
        again,
        _evaluation(_correct(900)),
        _rule(0.0),
        tracking_uri,
        champion=synthetic_champion,
    ).promoted


def test_promotion_restore_aliases_puts_them_back(tracking_uri: str) -> None:
    first, second = _register(tracking_uri, "undo"), _register(tracking_uri, "undo")
    promote("undo", first, _evaluation(_correct(500)), _rule(0.0), tracking_uri)
    before = aliases_of("undo", tracking_uri)
    promote(
        "undo",
        second,
        _evaluation(_correct(900)),
        _rule(0.0),
        tracking_uri,
        champion=_score(first, _correct(500)),
    )
    assert aliases_of("undo", tracking_uri) == {"champion": second, "challenger": None}
    assert restore_aliases("undo", before, tracking_uri, ours=second) == ["champion"]
    assert aliases_of("undo", tracking_uri) == {"champion": first, "challenger": None}


def test_promotion_a_rollback_restores_only_what_its_publish_changed(tracking_uri: str) -> None:
    """Aliases moved by hand (or another publish) after this one moved them stay where they
    were put; those still on this publish's version go back."""
    first, second, third = (_register(tracking_uri, "mine") for _ in range(3))
    promote("mine", first, _evaluation(_correct(500)), _rule(0.0), tracking_uri)
    client = MlflowClient(tracking_uri)
    client.set_registered_model_alias("mine", "challenger", first)
    before = aliases_of("mine", tracking_uri)  # champion and challenger on the first
    client.set_registered_model_alias("mine", "champion", second)  # this publish's move
    client.set_registered_model_alias("mine", "challenger", second)
    client.set_registered_model_alias("mine", "challenger", third)  # someone else's, since
    assert restore_aliases("mine", before, tracking_uri, ours=second) == ["champion"]
    assert aliases_of("mine", tracking_uri) == {"champion": first, "challenger": third}
    client.set_registered_model_alias("mine", "champion", third)  # moved by hand
    assert restore_aliases("mine", before, tracking_uri, ours=second) == []
    assert aliases_of("mine", tracking_uri)["champion"] == third


def test_champion_score_evaluates_once_per_test_split(tracking_uri: str, tmp_path: Path) -> None:
    run_id = start_run(tracking_uri, "promotion-test", "scored", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    assert champion_score("scored", _dataset(tmp_path / "a", 1), tracking_uri) is None
    version = register_model(model, run_id, "scored", tracking_uri)
    promote("scored", version, _evaluation(_correct(10, 20)), _rule(0.0), tracking_uri)
    first = _dataset(tmp_path / "a", 1)
    score = champion_score("scored", first, tracking_uri)
    assert score is not None and score.test_digest == first.manifest.digest("test")
    assert score.correct.shape == (20,) and score.accuracy == score.correct.mean()
    client = MlflowClient(tracking_uri)
    tag = accuracy_tag(score.test_digest)
    assert float(client.get_model_version("scored", version).tags[tag]) == pytest.approx(
        score.accuracy
    )
    # The per-image results kept with the version's model are read, not computed again.
    kept = read_evidence(client, "scored", version, score.test_digest)
    assert kept is not None and (kept == score.correct).all()
    keep_evidence(client, "scored", version, score.test_digest, _correct(7, 20))
    again_first = champion_score("scored", first, tracking_uri)
    assert again_first is not None and again_first.accuracy == 7 / 20
    # Another test split, labelled so that the model is right on exactly 13 of its 20 images:
    # evaluated on it, the champion scores 0.65.
    with torch.no_grad():
        predicted = model.eval()(torch.from_numpy(_images(2))).argmax(1).numpy()
    labels = np.where(np.arange(20) < 13, predicted, (predicted + 1) % 10)
    other = _dataset(tmp_path / "b", 2, labels=labels)
    assert other.manifest.digest("test") != score.test_digest
    again = champion_score("scored", other, tracking_uri)
    assert again is not None and again.accuracy == pytest.approx(13 / 20)


SPEC = ModelSpec("small_cnn", (0.5,) * 3, (0.25,) * 3)


def untrained_model(seed: int = 0) -> torch.nn.Module:
    """An untrained small_cnn, the same one for the same ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SPEC.build()


def write_checkpoint(directory: Path, epoch: int = 0, seed: int = 0) -> str:
    """A training checkpoint of an untrained small_cnn (``untrained_model(seed)``: what a run's
    best checkpoint holds), saved after ``epoch``."""
    spec = SPEC
    model = untrained_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    directory.mkdir(parents=True)
    save_training_state(
        str(directory),
        model=model,
        spec=spec,
        optimizer=optimizer,
        scheduler=scheduler,
        epoch=epoch,
        hyperparameters={},
    )
    return str(directory)


def test_register_tags_the_data_digest(tracking_uri: str, tmp_path: Path) -> None:
    dataset = _dataset(tmp_path / "data", 3, synthetic=True)
    checkpoint = write_checkpoint(tmp_path / "checkpoint")
    run_id = start_run(tracking_uri, "promotion-test", "tagged", {}, {})
    version = register_checkpoint(checkpoint, run_id, "tagged", tracking_uri, dataset)
    tags = MlflowClient(tracking_uri).get_model_version("tagged", version).tags
    assert tags["data_digest"] == dataset.manifest.digest()
    assert tags["synthetic_data"] == "true"


def test_promotion_a_version_that_collapses_on_one_class_fails_its_gate(
    tracking_uri: str,
) -> None:
    """Better on average (significantly), but every image of one class wrong: @challenger, the
    failed gate as its reason and on its tags; the floor gate recorded as passed."""
    champion = _register(tracking_uri, "gated")
    promote("gated", champion, _evaluation(_correct(700)), _rule(), tracking_uri)
    collapsed = np.ones(1000, bool)
    collapsed[LABELS == 3] = False  # class 3 (cat) always wrong: 0.900 overall against 0.700
    newcomer = _register(tracking_uri, "gated")
    decision = promote(
        "gated",
        newcomer,
        _evaluation(collapsed),
        _rule(min_test_accuracy=0.5, max_class_drop=0.1),
        tracking_uri,
        champion=_score(champion, _correct(700)),
    )
    assert (decision.promoted, decision.alias) == (False, "challenger")
    assert (
        "failed the release gate class_drop: classes not shown to lose at most 0.1 "
        "(max_class_drop) against the champion: cat (0.700 to 0.000 on 100 images, lower limit "
    ) in decision.reason
    assert decision.reason.endswith(
        "champion version 1 stays (test split tttttttttttttttt; champion trained on dataset "
        "dddddddddddddddd)"
    )
    tags = MlflowClient(tracking_uri).get_model_version("gated", newcomer).tags
    assert tags["gate/class_drop"].startswith("failed: classes not shown to lose at most 0.1")
    assert tags["gate/accuracy_floor"] == (
        "passed: test accuracy 0.9000 is at least the floor 0.5 (min_test_accuracy)"
    )
    assert aliases_of("gated", tracking_uri) == {"champion": champion, "challenger": newcomer}


def test_promotion_a_first_version_below_the_floor_is_only_a_challenger(
    tracking_uri: str,
) -> None:
    version = _register(tracking_uri, "floored")
    decision = promote(
        "floored", version, _evaluation(_correct(200)), _rule(min_test_accuracy=0.5), tracking_uri
    )
    assert (decision.promoted, decision.alias) == (False, "challenger")
    assert decision.reason.startswith(
        "failed the release gate accuracy_floor: test accuracy 0.2000 is below the floor 0.5 "
        "(min_test_accuracy); better than chance: "
    )
    assert decision.reason.endswith("; no champion yet")


def test_promotion_writes_the_model_card_on_the_version(tracking_uri: str, tmp_path: Path) -> None:
    run_id = start_run(tracking_uri, "promotion-test", "carded", {"seed": 3, "lr": 0.05}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    champion = register_model(model, run_id, "carded", tracking_uri)
    promote("carded", champion, _evaluation(_correct(800)), _rule(), tracking_uri)
    newcomer = register_model(model, run_id, "carded", tracking_uri)
    dataset = _dataset(tmp_path / "data", 5)
    decision = promote(
        "carded",
        newcomer,
        _evaluation(_correct(803)),  # 3 more right, none fewer: p=0.125
        _rule(),
        tracking_uri,
        champion=_score(champion, _correct(800)),
        data=data_facts(dataset),
    )
    card = MlflowClient(tracking_uri).get_model_version("carded", newcomer).description
    assert card.startswith(f"# carded version {newcomer}: @challenger\n")
    assert f"**Decision.** Not promoted: {decision.reason}." in card
    assert f"dataset digest `{dataset.manifest.digest()}`" in card
    assert "images: test 20, train 20, val 20" in card
    assert "| seed | 3 |" in card and "| lr | 0.05 |" in card
    assert "git_sha `" in card and "torch_version `" in card
    # Image i is of class i % 10: images 800-802 (one more right in classes 0-2) decide.
    assert "| airplane | 0.810 | 0.800 |" in card and "| truck | 0.800 | 0.800 |" in card
    # 100 images a class, none changing hands in 7 classes, cannot show a drop of at most 4 points
    assert "| class_drop | failed | classes not shown to lose at most 0.04 (max_class_drop)" in card
    assert "| +0.0030 | " in card and "| 0 | not shown | 0.01848 |" in card


def test_evidence_of_two_versions_of_one_run_is_kept_apart(tracking_uri: str) -> None:
    """The same run_name published again makes a second version of the same training run: its
    evidence never overwrites the first's, and evidence that does not match its hash is not
    trusted."""
    run_id = start_run(tracking_uri, "promotion-test", "twice", {}, {})
    model = build_model("small_cnn", (0.5,) * 3, (0.25,) * 3)
    client = MlflowClient(tracking_uri)
    first = register_model(model, run_id, "twice", tracking_uri)
    second = register_model(model, run_id, "twice", tracking_uri)
    keep_evidence(client, "twice", first, "s" * 16, _correct(12, 20))
    keep_evidence(client, "twice", second, "s" * 16, _correct(17, 20))
    kept_first = read_evidence(client, "twice", first, "s" * 16)
    kept_second = read_evidence(client, "twice", second, "s" * 16)
    assert kept_first is not None and kept_first.sum() == 12
    assert kept_second is not None and kept_second.sum() == 17
    client.set_model_version_tag("twice", first, "evidence/" + "s" * 16, "0" * 64)  # tampered
    assert read_evidence(client, "twice", first, "s" * 16) is None


def test_register_gives_the_logged_model_the_metrics_of_its_checkpoints_epoch(
    tracking_uri: str, tmp_path: Path
) -> None:
    run_id = start_run(tracking_uri, "promotion-test", "stepped", {}, {})
    client = MlflowClient(tracking_uri)
    for epoch in range(3):
        client.log_metric(run_id, "val_accuracy", 0.5 + 0.1 * epoch, step=epoch)
    checkpoint = write_checkpoint(tmp_path / "epoch-2", epoch=2)
    dataset = _dataset(tmp_path / "data", 6)
    version = register_checkpoint(checkpoint, run_id, "stepped", tracking_uri, dataset)
    model_id = client.get_model_version("stepped", version).source.removeprefix("models:/")
    metrics = {m.key: (m.value, m.step) for m in client.get_logged_model(model_id).metrics or []}
    assert metrics["val_accuracy"] == (pytest.approx(0.7), 2)


def test_promotion_an_alias_moved_right_after_it_is_set_is_read_back_and_judged_again(
    tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone outside the publish queue moves ``@champion`` between the promote step's move
    and its read-back: the step does not report a promotion that did not hold."""
    first, second = _register(tracking_uri, "overtaken"), _register(tracking_uri, "overtaken")
    decision, _ = judge(
        "overtaken", second, _evaluation(_correct(600)), _rule(), tracking_uri, None, False
    )
    moved = MlflowClient.set_registered_model_alias

    def and_another_writer(self: MlflowClient, name: str, alias: str, version: str) -> None:
        moved(self, name, alias, version)
        moved(self, name, alias, first)  # the other writer, right after

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", and_another_writer)
    with pytest.raises(ChampionMoved, match=f"reads version {first} right after"):
        apply_decision("overtaken", second, _evaluation(_correct(600)), decision, tracking_uri)


def test_promotion_is_not_applied_once_the_champion_moved(tracking_uri: str) -> None:
    """Judged against no champion, but another publish made one meanwhile: nothing applied."""
    first, second = _register(tracking_uri, "raced"), _register(tracking_uri, "raced")
    decision, _ = judge(
        "raced", first, _evaluation(_correct(600)), _rule(), tracking_uri, None, False
    )
    assert decision.promoted and decision.champion is None
    promote("raced", second, _evaluation(_correct(700)), _rule(), tracking_uri)  # the other run
    with pytest.raises(ChampionMoved, match="moved after version 1 was judged"):
        apply_decision("raced", first, _evaluation(_correct(600)), decision, tracking_uri)
    assert aliases_of("raced", tracking_uri) == {"champion": second, "challenger": None}
    tags = MlflowClient(tracking_uri).get_model_version("raced", first).tags
    assert "promotion" not in tags


@pytest.mark.parametrize("moves", range(JUDGEMENTS + 1))
def test_promotion_is_judged_again_while_the_champion_moves(tracking_uri: str, moves: int) -> None:
    """Another publish moves ``@champion`` after each of the first ``moves`` judgements: each
    move has the new champion scored and the version judged against it; on every judgement,
    the step fails with ``ChampionMoved`` and its version is left untouched."""
    name = f"moving-{moves}"
    others = [_register(tracking_uri, name) for _ in range(JUDGEMENTS)]
    newcomer = _register(tracking_uri, name)
    client = MlflowClient(tracking_uri)
    judged_against: list[str | None] = []
    scored: list[str] = []

    def another_publish(decision: Decision) -> None:
        judged_against.append(decision.champion)
        if len(judged_against) <= moves:
            client.set_registered_model_alias(name, "champion", others[len(judged_against) - 1])

    def rescore() -> ChampionScore:
        now = str(client.get_model_version_by_alias(name, "champion").version)
        scored.append(now)
        return _score(now, _correct(500))

    def run() -> Promotion:
        return promote(
            name,
            newcomer,
            _evaluation(_correct(900)),
            _rule(),
            tracking_uri,
            rescore=rescore,
            on_decision=another_publish,
        )

    if moves == JUDGEMENTS:
        with pytest.raises(ChampionMoved):
            run()
        assert "promotion" not in client.get_model_version(name, newcomer).tags
        assert aliases_of(name, tracking_uri)["champion"] == others[-1]
    else:
        promotion = run()
        assert promotion.promoted and aliases_of(name, tracking_uri)["champion"] == newcomer
    assert judged_against == [None, *others[: min(moves, JUDGEMENTS - 1)]]
    assert scored == others[: min(moves, JUDGEMENTS - 1)]
