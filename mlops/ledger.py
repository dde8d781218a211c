"""The ledger of comparisons: every candidate judged against the champion on a test split,
kept in the registry (tags of the registered model), with the alpha it spent.

Each nightly tests a new candidate against the champion on the same test split. Tested each at
alpha, equally good models would be promoted by chance more and more often over the model's
life (0.39 after 30 candidates at alpha 0.05). So alpha is *spent*: the k-th comparison on a
split tests at ``alpha · 6 / (π² k²)``, and since Σ 6 / (π² k²) = 1, the chance of any false
promotion over the life of that split stays at most alpha, however many candidates come (a
Bonferroni bound over an infinite sequence, by Euler's Σ 1/k² = π²/6). It holds whatever the
comparisons' dependence (they share the split and the champion), needs no estimate of how many
candidates will come, and front-loads the budget: the first comparison tests at 0.61·alpha,
the tenth at 0.006·alpha. A new test split (new data) starts a new budget. An online FDR rule
(LORD++) would spend more freely but bounds the *proportion* of false promotions, not the
chance of any: a champion serves users, one false promotion is one too many.

A (data, code, training options) combination already compared on a split is not compared again:
``compared`` finds it, and the pipeline does not train it again (``tasks.retraining``), so a
recipe that lost cannot be retried until, by chance, it wins.

An entry is the tag ``ledger/<split digest>/<k>`` (k zero-padded) holding JSON. No Prefect.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mlflow.tracking import MlflowClient

PREFIX = "ledger/"


def alpha_spent(k: int, alpha: float) -> float:
    """The alpha of the ``k``-th comparison (1-based) on a split."""
    if k < 1:
        raise ValueError(f"comparisons are counted from 1, got {k}")
    return alpha * 6 / (math.pi**2 * k**2)


def budget_left(k: int, alpha: float) -> float:
    """What is left of ``alpha`` once ``k`` comparisons spent theirs."""
    return alpha - sum(alpha_spent(j, alpha) for j in range(1, k + 1))


def recipe(data_digest: str, code: str, params: Mapping[str, Any]) -> str:
    """A short digest of what made a model: its data, its code (commit) and its training
    options (the training run's params, as strings)."""
    text = json.dumps(
        {"data": data_digest, "code": code, "params": {k: str(v) for k, v in params.items()}},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    """One comparison, as the ledger keeps it."""

    k: int  # its place among the comparisons on the split
    split: str  # the test split's digest
    version: str  # the candidate
    champion: str  # the version it was compared with
    recipe: str  # the candidate's (``recipe``)
    num_images: int
    only_new: int
    only_champion: int
    alpha: float  # spent on it
    low: float  # the gain's one-sided limits
    high: float
    verdict: str  # better, not shown, worse

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.split}/{self.k:05d}"


def entries(client: MlflowClient, model_name: str, split: str | None = None) -> list[Entry]:
    """The comparisons recorded for ``model_name`` (on ``split``, if given), in order."""
    tags = client.get_registered_model(model_name).tags or {}
    found = [
        Entry(**json.loads(value))
        for key, value in tags.items()
        if key.startswith(PREFIX) and (split is None or key.startswith(f"{PREFIX}{split}/"))
    ]
    return sorted(found, key=lambda e: (e.split, e.k))


def next_k(client: MlflowClient, model_name: str, split: str) -> int:
    """The place the next comparison on ``split`` takes."""
    return len(entries(client, model_name, split)) + 1


def place_of(client: MlflowClient, model_name: str, split: str, version: str) -> int:
    """The place of ``version``'s comparison on ``split``: the one it was given already (a
    retried promote step judges it again with the alpha it spent, and comes to the same
    verdict), else the next one."""
    found = entries(client, model_name, split)
    return next((e.k for e in found if e.version == version), len(found) + 1)


def record(client: MlflowClient, model_name: str, entry: Entry) -> None:
    """Keep ``entry`` in the registry."""
    client.set_registered_model_tag(model_name, entry.key, json.dumps(asdict(entry)))


def compared(client: MlflowClient, model_name: str, recipe_digest: str) -> Entry | None:
    """The first comparison of a model made by ``recipe_digest``, on any split, or None."""
    return next((e for e in entries(client, model_name) if e.recipe == recipe_digest), None)
