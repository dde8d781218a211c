"""get_dataset_shard(): this rank's DataIterator of a dataset given to the trainer."""

from __future__ import annotations

from trainlib._internal.rank.session import current_session
from trainlib.data.iterator import DataIterator

_iterators: dict[str, DataIterator] = {}


def get_dataset_shard(name: str) -> DataIterator:
    """This rank's shard of ``TorchTrainer(datasets={name: ...})``.

    Raises:
        RuntimeError: Called outside a training function.
        KeyError: The trainer has no dataset called ``name``.
    """
    names = current_session("get_dataset_shard()").spec.dataset_names
    if name not in names:
        raise KeyError(
            f"get_dataset_shard({name!r}): the trainer has no dataset {name!r}; "
            f"TorchTrainer(datasets=...) gave {sorted(names) or 'none'}."
        )
    if name not in _iterators:
        plan = current_session("get_dataset_shard()").spec.data_cache.get(name)
        _iterators[name] = DataIterator(name, plan)
    return _iterators[name]
