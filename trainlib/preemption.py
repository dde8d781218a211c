"""PreemptionInfo: a Dask worker hosting ranks of a run is retiring (plain data)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreemptionInfo:
    """Which ranks are about to lose their Dask worker, as Ray Train's ``PreemptionInfo``.

    Attributes:
        deadline_ms: When the workers will be gone (UNIX time in milliseconds); None: Dask
            gives no deadline (a retiring worker leaves once its data is elsewhere).
        preempted_node_to_ranks: Each retiring worker's address and the world ranks on it.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        """The retiring workers' addresses, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """The world ranks on the retiring workers, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})
