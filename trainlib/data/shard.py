"""get_dataset_shard(): this rank's DataIterator of a dataset given to the trainer."""

from __future__ import annotations

from trainlib._internal.rank.process_globals import RANK, current_session
from trainlib.data.iterator import DataIterator


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
    iterators = RANK.dataset_iterators  # one per dataset for the whole training function
    if name not in iterators:
        plan = current_session("get_dataset_shard()").spec.data_cache.get(name)
        iterators[name] = DataIterator(name, plan)
    iterator: DataIterator = iterators[name]
    return iterator
