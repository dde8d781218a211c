"""Collective operations across the ranks of a run, as in ``ray.train.collective``."""

from trainlib.collective.collectives import barrier, broadcast_from_rank_zero

__all__ = ["barrier", "broadcast_from_rank_zero"]
