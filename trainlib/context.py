"""TrainContext: where this rank sits in the worker group."""

from __future__ import annotations

from dataclasses import dataclass

from trainlib._internal.rank.process_globals import current_session


@dataclass(frozen=True)
class TrainContext:
    """The rank's position; get it with ``trainlib.get_context()`` inside a training function."""

    world_size: int
    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str

    def get_world_size(self) -> int:
        """Number of ranks in the group."""
        return self.world_size

    def get_world_rank(self) -> int:
        """This rank's global index, 0 to world_size - 1."""
        return self.world_rank

    def get_local_rank(self) -> int:
        """This rank's index among the ranks on its host."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """Number of ranks on this rank's host."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """Index of this rank's host among the group's hosts."""
        return self.node_rank

    def get_experiment_name(self) -> str:
        """The run name (``RunConfig.name``)."""
        return self.experiment_name


def get_context() -> TrainContext:
    """The current rank's TrainContext.

    Raises:
        RuntimeError: Called outside a training function.
    """
    spec = current_session("get_context()").spec
    return TrainContext(
        world_size=spec.world_size,
        world_rank=spec.world_rank,
        local_rank=spec.local_rank,
        local_world_size=spec.local_world_size,
        node_rank=spec.node_rank,
        experiment_name=spec.run_name,
    )
