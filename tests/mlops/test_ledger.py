"""The ledger: a registered model's budget, fixed once; each comparison's place and alpha; entries
written once per version. Fuzzed: random lives of comparisons over splits, retries, old entries."""

from __future__ import annotations

import itertools
import json
import math
import uuid
from dataclasses import asdict, replace

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from cifar.errors import InvalidParameterError
from mlops import ledger
from mlops.ledger import Entry, next_place, share


def _model(tracking_uri: str) -> tuple[MlflowClient, str]:
    client = MlflowClient(tracking_uri)
    name = f"ledger-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name)
    return client, name


def _entry(place: ledger.Place, split: str, version: str, verdict: str, ms: int) -> Entry:
    return Entry(
        place.k, split, version, "1", "r", 1000, 10, 5, place.alpha, -0.01, 0.02, verdict,
        place.split_number, place.carried, ms,
    )  # fmt: skip


def test_budget_is_fixed_by_the_first_judgement_and_no_run_changes_it(tracking_uri: str) -> None:
    client, name = _model(tracking_uri)
    assert ledger.budget(client, name, "1", 0.1) == ledger.Budget(0.1, "1")
    assert ledger.budget(client, name, "2", None) == ledger.Budget(0.1, "1")
    assert ledger.budget(client, name, "3", 0.1) == ledger.Budget(0.1, "1")
    with pytest.raises(InvalidParameterError) as refused:
        ledger.budget(client, name, "4", 0.5)
    assert str(refused.value).startswith(
        f"promote_alpha=0.5: the lifetime false-promotion budget of {name} was fixed at 0.1 "
        "when its version 1 was judged"
    )
    _, fresh = _model(tracking_uri)
    assert ledger.budget(client, fresh, "1", None).alpha == ledger.DEFAULT_ALPHA


@pytest.mark.parametrize("seed", range(20))
def test_random_lives_never_spend_more_than_the_models_alpha(seed: int) -> None:
    """A random life: comparisons on splits that come and go back, random verdicts, retried
    steps. Every comparison's own share adds up to at most alpha; a promoted comparison passes
    exactly its alpha to the next on its split; a retry gets its first place back."""
    rng = np.random.default_rng(seed)
    alpha = float(rng.choice([0.01, 0.05, 0.2]))
    recorded: list[Entry] = []
    splits = [f"{i:016x}" for i in range(int(rng.integers(1, 6)))]
    for number in range(int(rng.integers(1, 120))):
        split = splits[int(rng.integers(len(splits)))]
        version = str(number + 2)
        place = next_place(recorded, split, version, alpha)
        verdict = str(rng.choice(["better", "not shown", "worse"], p=[0.3, 0.6, 0.1]))
        recorded.append(_entry(place, split, version, verdict, number))
        if rng.random() < 0.2:  # a retried step of an earlier version
            earlier = recorded[int(rng.integers(len(recorded)))]
            again = next_place(recorded, earlier.split, earlier.version, alpha)
            assert (again.k, again.alpha, again.entry) == (earlier.k, earlier.alpha, earlier)
    own = sum(e.alpha - e.carried for e in recorded)
    assert own <= alpha * (1 + 1e-12)
    numbers = {e.split: e.split_number for e in recorded}
    first_seen = list(dict.fromkeys(e.split for e in recorded))
    assert [numbers[s] for s in first_seen] == list(range(1, len(first_seen) + 1))
    for split in first_seen:
        mine = [e for e in recorded if e.split == split]
        assert [e.k for e in mine] == list(range(1, len(mine) + 1))
        for before, after in itertools.pairwise(mine):
            passed = before.alpha if before.verdict == "better" else 0.0
            assert after.carried == passed
            own_share = share(after.split_number) * share(after.k) * alpha
            assert after.alpha == pytest.approx(own_share + passed)


def test_a_new_split_gets_a_smaller_share_never_a_fresh_budget() -> None:
    first = next_place([], "a" * 16, "2", 0.05)
    recorded = [_entry(first, "a" * 16, "2", "not shown", 1)]
    second = next_place(recorded, "b" * 16, "3", 0.05)
    assert (second.split_number, second.k) == (2, 1)
    assert second.alpha == pytest.approx(first.alpha / 4)  # 6/(π²·2²) of the model's share


def test_entries_written_before_splits_were_numbered_keep_their_place(tracking_uri: str) -> None:
    """A ledger kept before (keys ledger/<split>/<k>, no split number, no time): its split is
    the model's first, and its comparisons count."""
    client, name = _model(tracking_uri)
    old = Entry(1, "o" * 16, "2", "1", "r", 1000, 10, 5, 0.0304, -0.01, 0.02, "not shown")
    raw = {k: v for k, v in asdict(old).items() if k not in ("split_number", "carried")}
    del raw["recorded_ms"]
    client.set_registered_model_tag(name, f"ledger/{'o' * 16}/00001", json.dumps(raw))
    again = ledger.place_of(client, name, "o" * 16, "3", 0.05)
    assert (again.split_number, again.k) == (1, 2)
    new_split = ledger.place_of(client, name, "n" * 16, "3", 0.05)
    assert (new_split.split_number, new_split.k) == (2, 1)


def test_entries_are_written_once_per_version_and_none_is_lost(tracking_uri: str) -> None:
    """Two publishers judged at the same place (neither saw the other's entry) both keep their
    entry; a version's entry written again stays as first written."""
    client, name = _model(tracking_uri)
    place = next_place([], "s" * 16, "", 0.05)
    a = _entry(place, "s" * 16, "2", "not shown", 0)
    b = _entry(place, "s" * 16, "3", "better", 0)
    ledger.record(client, name, a)
    ledger.record(client, name, b)
    ledger.record(client, name, replace(a, verdict="better"))
    kept = ledger.entries(client, name, "s" * 16)
    assert sorted((e.version, e.verdict) for e in kept) == [("2", "not shown"), ("3", "better")]
    assert all(e.recorded_ms > 0 for e in kept)
    assert math.isclose(kept[0].alpha, place.alpha)
