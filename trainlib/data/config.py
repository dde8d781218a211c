"""DataConfig: how ``TorchTrainer(datasets=...)`` reaches the ranks (Ray Train's DataConfig)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from trainlib.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which datasets are split across the ranks, and how a pass orders their partitions.

    Args:
        datasets_to_split: ``"all"``, or the names of the datasets to split: at every pass
            each rank gets the same number of rows, different rows on every rank. A dataset
            not named is given whole to every rank, partitions in order.
        shuffle_seed: Seed of the shuffle of partition order a split dataset gets at every
            pass; each pass (and each restart after a failure) gets another order. ``None``
            keeps the partitions in order.
    """

    datasets_to_split: Literal["all"] | Sequence[str] = "all"
    shuffle_seed: int | None = 0

    def __post_init__(self) -> None:
        if isinstance(self.datasets_to_split, str) and self.datasets_to_split != "all":
            raise ConfigError(
                f"DataConfig(datasets_to_split={self.datasets_to_split!r}) must be 'all' or a "
                f"list of dataset names, e.g. [{self.datasets_to_split!r}]."
            )

    def split_names(self, datasets: Iterable[str]) -> list[str]:
        """The names of the datasets to split, given the names of those the trainer has."""
        if self.datasets_to_split == "all":
            return list(datasets)
        return list(self.datasets_to_split)
