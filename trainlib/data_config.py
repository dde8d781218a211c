"""DataConfig: how ``TorchTrainer(datasets=...)`` reaches the ranks (Ray Train's DataConfig).
Also ``trainlib.data.DataConfig``."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from trainlib.errors import ConfigError

if TYPE_CHECKING:
    from trainlib.execution_options import ExecutionOptions

logger = logging.getLogger(__name__)

CacheLocation = Literal["off", "host", "device"]


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which datasets are split across the ranks, and how a pass orders their partitions.

    Args:
        datasets_to_split: ``"all"``, or the names of the datasets to split: at every pass
            each rank gets the same number of rows, different rows on every rank. A dataset
            not named is given whole to every rank, partitions in order.
        shuffle_seed: With a seed, a split dataset's partition order is shuffled at every
            pass; each pass (and each restart after a failure) gets another order. ``None``
            (the default, as Ray Data does not reorder blocks) keeps the partitions in order;
            rows within a rank's batches are shuffled by ``local_shuffle_buffer_size``.
        cache_shards: ``"host"`` or ``"device"``: each rank keeps its shard of every dataset
            after its first complete pass, in host memory or on its device (its GPU; the CPU
            without one), and later passes read it with no Dask traffic: the same rows every
            pass, in an order shuffled locally per pass (split datasets with a
            ``shuffle_seed``, or ``local_shuffle_buffer_size``). ``"off"`` streams every pass.
        cache_budget_bytes: The largest shard a rank keeps; a larger one streams every pass.
        execution_options: Ray Data's ``ExecutionOptions`` (start from
            ``default_ingest_options()``), for every dataset or a dict by dataset name: hints.
            Dask keeps partitions in order (``preserve_order``) and reads next to the data
            (``locality_with_output``); resource limits have no counterpart and are named in
            one warning (``trainlib.execution_options``).
    """

    datasets_to_split: Literal["all"] | Sequence[str] = "all"
    shuffle_seed: int | None = None
    cache_shards: CacheLocation = "off"
    cache_budget_bytes: int = 2 * 1024**3
    execution_options: ExecutionOptions | Mapping[str, ExecutionOptions] | None = None

    @staticmethod
    def default_ingest_options() -> ExecutionOptions:
        """Ray Train's execution options for ingest, to adjust and pass back."""
        from trainlib.execution_options import default_ingest_options

        return default_ingest_options()

    def __post_init__(self) -> None:
        if self.execution_options is not None:
            from trainlib.execution_options import check_type, unapplied

            check_type(self.execution_options)
            hints = unapplied(self.execution_options)
            if hints:
                logger.warning(
                    "DataConfig: Ray Data's execution options Dask does not apply: %s. The run "
                    "goes on without them.",
                    "; ".join(hints),
                )
        if hasattr(self, "configure"):
            raise ConfigError(
                f"{type(self).__name__}.configure() would be ignored: on Dask trainlib deals "
                "each rank its share (datasets_to_split, shuffle_seed, cache_shards), so a "
                "DataConfig subclass cannot. Transform a dataset with map_partitions before "
                "passing it, or give it unsplit (datasets_to_split) and pick rows in the "
                "training function with get_context().get_world_rank()."
            )
        if self.cache_shards not in ("off", "host", "device") or self.cache_budget_bytes < 0:
            raise ConfigError(
                f"DataConfig(cache_shards={self.cache_shards!r}, cache_budget_bytes="
                f"{self.cache_budget_bytes}) needs 'off', 'host' or 'device' and a budget >= 0."
            )
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
