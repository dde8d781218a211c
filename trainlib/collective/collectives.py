"""barrier() and broadcast_from_rank_zero(), over the run's torch.distributed process group."""

from __future__ import annotations

from typing import TypeVar

from trainlib._internal.rank.process_globals import current_session

T = TypeVar("T")


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every rank; every rank must call it (it is a barrier too).

    Ray meant it for small values (it warns above 1 kB); here it is a
    ``torch.distributed.broadcast_object_list`` on the run's process group, so any
    picklable value works, at the cost of sending it.

    Example:
        >>> config = {"lr": 0.1} if trainlib.get_context().get_world_rank() == 0 else None
        >>> config = broadcast_from_rank_zero(config)

    Args:
        data: A picklable value; only rank 0's is used.

    Returns:
        Rank 0's value.

    Raises:
        RuntimeError: Called outside a training function.
    """
    current_session("collective.broadcast_from_rank_zero()")
    import torch.distributed as dist

    box = [data]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait until every rank has called ``barrier()``.

    Raises:
        RuntimeError: Called outside a training function.
    """
    current_session("collective.barrier()")
    import torch.distributed as dist

    dist.barrier()
