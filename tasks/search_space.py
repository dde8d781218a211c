"""A search space as JSON (a flow parameter) and as trainlib.tune domains."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cifar.errors import InvalidParameterError
from cifar.train_loop import TrainConfig
from trainlib import tune

DEFAULT_SEARCH_SPACE: dict[str, list[Any]] = {
    "lr": ["loguniform", 0.01, 0.3],
    "batch_size": ["choice", [128, 256]],
    "model": ["choice", ["small_cnn"]],
}
_DOMAINS: dict[str, Callable[..., Any]] = {
    "uniform": tune.uniform,
    "loguniform": tune.loguniform,
    "quniform": tune.quniform,
    "randint": tune.randint,
    "choice": tune.choice,
    "grid_search": tune.grid_search,
}


def search_space(spec: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """Tune domains from a JSON search space: ``{"lr": ["loguniform", 0.01, 0.3], ...}``.

    Keys are ``TrainConfig`` fields; each value names a ``trainlib.tune`` helper and its
    arguments.
    """
    fields = set(TrainConfig.__dataclass_fields__)
    space = {}
    for name, entry in spec.items():
        if name not in fields or not entry or entry[0] not in _DOMAINS:
            raise InvalidParameterError(
                f"search_space[{name!r}] = {entry!r} is not a search domain; use a TrainConfig "
                f"field ({', '.join(sorted(fields))}) with [kind, args...], kind one of "
                f"{', '.join(_DOMAINS)} (search_space)."
            )
        try:
            space[name] = _DOMAINS[entry[0]](*entry[1:])
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(f"search_space[{name!r}]: {exc} (search_space).") from exc
    return space


def check_search_space(spec: Mapping[str, Sequence[Any]]) -> None:
    """Raise ``InvalidParameterError`` naming the fix unless ``spec`` is a valid search space."""
    search_space(spec)


def largest_batch_size(spec: Mapping[str, Sequence[Any]], base: TrainConfig) -> int:
    """The largest global batch size a trial of ``spec`` can get (``base``'s if not searched):
    the dataset must hold a batch of it for every rank."""
    entry = spec.get("batch_size")
    if not entry:
        return base.batch_size
    kind, *args = entry
    values = args[0] if kind in ("choice", "grid_search") else args[:2]
    return int(max(values))
