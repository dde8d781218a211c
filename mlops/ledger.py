"""The ledger of comparisons: every candidate judged against the champion, kept in the registry
(tags of the registered model), with the alpha it spent from the model's lifetime budget.

**The budget belongs to the registered model.** Its alpha (the lifetime chance of any false
promotion) is fixed once, when its first version is judged, as the registered-model tag
``promotion/budget``; a later run cannot bring its own (``budget``). Tested each at alpha,
equally good candidates would be promoted by chance more and more often over the model's life
(0.39 after 30 at alpha 0.05), so alpha is *spent*, at two levels:

- the s-th test split the model is compared on (a split is keyed by the digest of its decoded
  images and labels, ``cifar.dataset.Manifest.digest``: re-cutting its files does not make it
  new) gets the share ``6/(π²s²)`` of the model's alpha;
- the k-th comparison on that split gets the share ``6/(π²k²)`` of the split's.

Both sums are 1 (Euler's Σ 1/k² = π²/6), so the alphas of every comparison the model will ever
make add up to at most its alpha: a Bonferroni bound over an infinite sequence, which holds
whatever the comparisons' dependence (they share splits and champions) and needs no estimate
of how many will come. A new split is no fresh start: it gets a smaller share than the last.

**Alpha is recycled after a promotion** (the online fallback procedure: L. Tian and A. Ramdas,
"Online control of the familywise error rate", Statistical Methods in Medical Research 30:976-993,
2021): a comparison that showed its candidate better passes the alpha it used on to the next
comparison on the same split, on top of that one's own share. That keeps the bound (a false
promotion is already the error the budget counts, and a true one owes nothing) under any
dependence, and keeps power while real gains keep coming: without it the tenth comparison on a
split tests at 0.006 of the split's alpha, whatever happened before it. ADDIS-spending would
also discard weak candidates' alpha but needs independent comparisons, which ours are not.

An online FDR rule (LORD++) would spend more freely but bounds the *proportion* of false
promotions, not the chance of any: a champion serves users, one false promotion is one too many.

**Entries are written once, keyed by version**: the tag ``ledger/<split digest>/v<version>``
holds JSON (``Entry``); a retried promote step finds its version's entry and reuses its place,
its alpha and so its verdict, adding nothing. A (data, code, training options) combination
already compared is not compared again: ``compared`` finds it, and the pipeline does not train it
again (``tasks.retraining``), so a recipe that lost cannot be retried until, by chance, it wins.
No Prefect.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mlflow.tracking import MlflowClient

from cifar.errors import InvalidParameterError

PREFIX = "ledger/"
BUDGET_TAG = "promotion/budget"
DEFAULT_ALPHA = 0.05  # a model's lifetime chance of a false promotion, unless its first run says


def share(i: int) -> float:
    """The share ``6/(π²i²)`` of a budget the ``i``-th (1-based) split or comparison gets."""
    if i < 1:
        raise ValueError(f"splits and comparisons are counted from 1, got {i}")
    return 6 / (math.pi**2 * i**2)


def shares_up_to(i: int) -> float:
    """The shares of the first ``i`` splits or comparisons, together."""
    return sum(share(j) for j in range(1, i + 1))


@dataclass(frozen=True)
class Budget:
    """A registered model's lifetime false-promotion budget, fixed at its first judgement."""

    alpha: float
    since_version: str  # the version whose judgement fixed it


def budget(client: MlflowClient, model_name: str, version: str, asked: float | None) -> Budget:
    """``model_name``'s budget: the one recorded, else fixed now (``asked``, else
    ``DEFAULT_ALPHA``) by ``version``'s judgement.

    Raises:
        InvalidParameterError: ``asked`` differs from the alpha the model was given.
    """
    tags = client.get_registered_model(model_name).tags or {}
    if BUDGET_TAG not in tags:
        fixed = Budget(DEFAULT_ALPHA if asked is None else asked, version)
        client.set_registered_model_tag(model_name, BUDGET_TAG, json.dumps(asdict(fixed)))
        tags = client.get_registered_model(model_name).tags or {}  # read back what was kept
    recorded = Budget(**json.loads(tags[BUDGET_TAG]))
    if asked is not None and not math.isclose(asked, recorded.alpha):
        raise InvalidParameterError(
            f"promote_alpha={asked:g}: the lifetime false-promotion budget of {model_name} was "
            f"fixed at {recorded.alpha:g} when its version {recorded.since_version} was judged "
            f"(registered-model tag {BUDGET_TAG}); a run cannot change it. Leave promote_alpha "
            "unset, or register the model under a new name to start another budget"
        )
    return recorded


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
    alpha: float  # spent on it: its share and what a promoted comparison before passed on
    low: float  # the gain's one-sided limits
    high: float
    verdict: str  # better, not shown, worse
    split_number: int = 0  # s: the split's place among the model's (0: before they were kept)
    carried: float = 0.0  # of alpha, passed on by the comparison before it
    recorded_ms: int = 0  # when it was written (0: before that was kept)

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.split}/v{self.version}"


@dataclass(frozen=True)
class Place:
    """Where a comparison stands in the model's budget, and the alpha it may use."""

    split_number: int  # s
    k: int
    share: float  # of the model's alpha: share(s) · share(k)
    carried: float  # passed on by the comparison before it on the split (it promoted)
    alpha: float  # share · the model's alpha + carried
    split_left: float  # of the split's shares, for the comparisons after it (of the alpha)
    entry: Entry | None = None  # the version's own, when it was judged already (a retry)


def entries(client: MlflowClient, model_name: str, split: str | None = None) -> list[Entry]:
    """The comparisons recorded for ``model_name`` (on ``split``, if given), in order."""
    tags = client.get_registered_model(model_name).tags or {}
    found = [
        Entry(**json.loads(value))
        for key, value in tags.items()
        if key.startswith(PREFIX) and (split is None or key.startswith(f"{PREFIX}{split}/"))
    ]
    return sorted(found, key=lambda e: (e.split, e.k, e.recorded_ms))


def next_place(recorded: Sequence[Entry], split: str, version: str, alpha: float) -> Place:
    """The place of ``version``'s comparison on ``split``, given the model's ``recorded``
    entries and its ``alpha``: its own if it has one (a retried step), else the next one."""
    splits = _split_numbers(recorded)
    s = splits.get(split, len(splits) + 1)
    mine = sorted((e for e in recorded if e.split == split), key=lambda e: (e.k, e.recorded_ms))
    own = next((e for e in mine if e.version == version), None)
    k = own.k if own is not None else len(mine) + 1
    before = next((e for e in reversed(mine) if e.k == k - 1), None)
    carried = before.alpha if before is not None and before.verdict == "better" else 0.0
    if own is not None:
        carried = own.carried
    part = share(s) * share(k)
    left = share(s) * (1 - shares_up_to(k)) * alpha
    used = own.alpha if own is not None else part * alpha + carried
    return Place(s, k, part, carried, used, left, own)


def _split_numbers(recorded: Sequence[Entry]) -> dict[str, int]:
    """Each split's place among the model's, by the first comparison recorded on it."""
    first: dict[str, tuple[int, int, str]] = {}
    for e in recorded:
        order = (e.split_number, e.recorded_ms, e.split)  # entries kept before these: 0, 0
        if e.split not in first or order < first[e.split]:
            first[e.split] = order
    ranked = sorted(first, key=lambda split: first[split])
    return {split: number for number, split in enumerate(ranked, start=1)}


def place_of(
    client: MlflowClient, model_name: str, split: str, version: str, alpha: float
) -> Place:
    """``next_place`` for ``version`` of ``model_name`` on ``split``, from the registry."""
    return next_place(entries(client, model_name), split, version, alpha)


def record(client: MlflowClient, model_name: str, entry: Entry) -> None:
    """Keep ``entry`` in the registry, once: a version's entry already there stays as it is."""
    tags = client.get_registered_model(model_name).tags or {}
    if entry.key in tags:
        return
    stamped = entry if entry.recorded_ms else _stamped(entry)
    client.set_registered_model_tag(model_name, entry.key, json.dumps(asdict(stamped)))


def _stamped(entry: Entry) -> Entry:
    return Entry(**{**asdict(entry), "recorded_ms": int(time.time() * 1000)})


def compared(client: MlflowClient, model_name: str, recipe_digest: str) -> Entry | None:
    """The first comparison of a model made by ``recipe_digest``, on any split, or None."""
    return next((e for e in entries(client, model_name) if e.recipe == recipe_digest), None)
