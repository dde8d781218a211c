"""A rank's shard kept after its first pass (``DataConfig(cache_shards=...)``).

The first pass streams from Dask as usual and keeps the rows it hands out; once that pass ends
(a pass left unfinished keeps nothing), later passes read the kept rows with no Dask traffic:
every pass gets the same rows as the first, each rank keeps its equal share, and the order is
shuffled locally, per pass, with a seed of the pass and the rank. A shard larger than the
budget is not kept: every pass streams, as without the cache.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from trainlib._internal.common.messages import CachePlan

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Block = dict[str, np.ndarray]
Rows = TypeVar("Rows", "np.ndarray", "torch.Tensor")  # a pass's row order, on host or device


class ShardCollector:
    """The rows of a first pass, kept while they fit ``budget_bytes``."""

    def __init__(self, name: str, plan: CachePlan) -> None:
        self._name = name
        self._budget = plan.budget_bytes
        self._level = logging.INFO if plan.world_rank == 0 else logging.DEBUG
        self._blocks: list[Block] | None = []
        self._bytes = 0

    def add(self, block: Block) -> None:
        """Keep ``block`` (dropping everything kept once the budget is passed)."""
        if self._blocks is None:
            return
        self._bytes += sum(values.nbytes for values in block.values())
        if self._bytes > self._budget:
            logger.log(
                self._level,
                "datasets[%r]: this rank's shard is over the cache budget of %.0f MB; every "
                "pass streams it from Dask",
                self._name,
                self._budget / 1e6,
            )
            self._blocks = None
            return
        self._blocks.append(block)

    def finish(self) -> CachedShard | None:
        """The kept shard, after a complete pass; None when it did not fit."""
        if self._blocks is None or not self._blocks:
            return None
        columns = {k: np.concatenate([b[k] for b in self._blocks]) for k in self._blocks[0]}
        self._blocks = None
        shard = CachedShard(columns)
        logger.log(
            self._level,
            "datasets[%r]: kept this rank's %d rows (%.1f MB) after the first pass; later "
            "passes read no data from Dask",
            self._name,
            shard.num_rows,
            shard.nbytes / 1e6,
        )
        return shard


class CachedShard:
    """A rank's rows of a dataset, as columns; each pass reads them in its own order."""

    def __init__(self, columns: Block) -> None:
        self.columns = columns
        self.num_rows = len(next(iter(columns.values())))
        self.nbytes = sum(values.nbytes for values in columns.values())
        self._kept: dict[str, torch.Tensor] | None = None

    def order(
        self, plan: CachePlan, pass_id: int, local_shuffle: bool, local_seed: int | None
    ) -> np.ndarray:
        """The row order of pass ``pass_id``: shuffled for a shuffled split dataset or a
        local shuffle (``local_shuffle_buffer_size``), else as first read."""
        if not plan.shuffle and not local_shuffle:
            return np.arange(self.num_rows)
        seed = zlib.crc32(f"{plan.seed}:{pass_id}:{local_seed}".encode())
        return np.random.default_rng(seed).permutation(self.num_rows)

    def numpy_batches(self, order: np.ndarray, batch_size: int, drop_last: bool) -> Iterator[Block]:
        """Batches of ``batch_size`` rows in ``order`` (the last one may be smaller)."""
        for rows in _slices(order, batch_size, drop_last):
            yield {k: v.take(rows, axis=0) for k, v in self.columns.items()}

    def torch_batches(
        self,
        order: np.ndarray,
        batch_size: int,
        drop_last: bool,
        where: torch.device,
        pinned: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Batches as tensors gathered on ``where``: the rank's GPU (the ``"device"``
        location: the rows are copied there once) or the host, into pinned memory when
        ``pinned`` (a GPU rank's copies from it are then asynchronous)."""
        import torch

        tensors = self._tensors(where)
        pinned = pinned and where.type == "cpu"
        on_device = torch.from_numpy(order).to(where)  # once a pass: a copy from the host waits
        for rows in _slices(on_device, batch_size, drop_last):
            batch = {}
            for name, values in tensors.items():
                gathered = torch.empty(
                    (len(rows), *values.shape[1:]),
                    dtype=values.dtype,
                    device=values.device,
                    pin_memory=pinned,
                )
                batch[name] = torch.index_select(values, 0, rows, out=gathered)
            yield batch

    def _tensors(self, where: torch.device) -> dict[str, torch.Tensor]:
        """The columns as tensors on ``where`` (made once; no copy in host memory)."""
        import torch

        if self._kept is None or next(iter(self._kept.values())).device != where:
            self._kept = {k: torch.from_numpy(v).to(where) for k, v in self.columns.items()}
        return self._kept


def _slices(order: Rows, batch_size: int, drop_last: bool) -> Iterator[Rows]:
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        yield order[start : start + batch_size]
