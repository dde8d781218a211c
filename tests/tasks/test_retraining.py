"""Whether training again would change anything: the champion's recipe, or any recipe the
ledger already holds a comparison of, is not trained again (on a real MLflow sqlite store)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from mlops import ledger
from mlops.tracking import git_sha
from tasks.retraining import unchanged_since_champion

PARAMS = {"model": "small_cnn", "epochs": 5, "lr": 0.05, "seed": 3}


def _compared(uri: str, model: str, params: dict[str, object], verdict: str) -> None:
    """A ledger entry, as the promote step records it, of a version made from ``params``."""
    client = MlflowClient(uri)
    client.create_registered_model(model)
    recipe = ledger.recipe("d" * 16, git_sha(), params)
    entry = ledger.Entry(1, "s" * 16, "2", "1", recipe, 1000, 10, 12, 0.03, -0.01, 0.01, verdict)
    ledger.record(client, model, entry)


def test_retraining_a_recipe_already_compared_is_not_trained_again(tracking_uri: str) -> None:
    _compared(tracking_uri, "lost-once", PARAMS, "not shown")
    reason = unchanged_since_champion("lost-once", "d" * 16, PARAMS, tracking_uri)
    assert reason is not None
    assert "made version 2 of lost-once, already compared with champion version 1" in reason
    assert "(not shown)" in reason and "force=true" in reason
    other_seed = {**PARAMS, "seed": 4}
    assert unchanged_since_champion("lost-once", "d" * 16, other_seed, tracking_uri) is None
    assert unchanged_since_champion("lost-once", "e" * 16, PARAMS, tracking_uri) is None


def test_retraining_a_model_without_ledger_or_champion_trains(tracking_uri: str) -> None:
    assert unchanged_since_champion("new-model", "d" * 16, PARAMS, tracking_uri) is None
