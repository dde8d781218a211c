"""The datasets of a local-mode run (``num_workers=0``), read in the calling process: each
block the training function asks for is one partition, computed here with Dask's synchronous
scheduler (no cluster, and a breakpoint in a transform stops where it is)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence

from trainlib._internal.common.datasets import Block, DatasetSource
from trainlib._internal.worker.rows_per_rank import pass_order
from trainlib.errors import DatasetError

Deliver = Callable[[str, int, Block | DatasetError | None], None]


class LocalFeed:
    """Answers the training function's requests for the next block of a pass."""

    def __init__(
        self, sources: Sequence[DatasetSource], shuffle_seed: int | None, deliver: Deliver
    ) -> None:
        self._sources = {source.name: source for source in sources}
        self._shuffle_seed = shuffle_seed
        self._deliver = deliver
        self._passes: dict[str, tuple[int, Iterator[Block]]] = {}

    def request(self, name: str, pass_id: int) -> None:
        """Deliver the next block of ``name``'s pass ``pass_id`` (None once it ended)."""
        current = self._passes.get(name)
        if current is None or current[0] != pass_id:  # a new pass (an unfinished one dropped)
            current = (pass_id, self._blocks(self._sources[name], pass_id))
            self._passes[name] = current
        try:
            block: Block | DatasetError | None = next(current[1], None)
        except Exception as exc:  # the training function raises it, so the run fails with it
            block = DatasetError(
                f"Computing datasets[{name!r}] in local mode failed: {type(exc).__name__}: {exc}"
            )
            del self._passes[name]
        self._deliver(name, pass_id, block)

    def _blocks(self, source: DatasetSource, pass_id: int) -> Iterator[Block]:
        from dask.base import compute

        seed = None
        if self._shuffle_seed is not None and source.split:
            seed = zlib.crc32(f"{self._shuffle_seed}:local:{pass_id}".encode())
        for partition in pass_order(len(source.partitions), seed):
            (block,) = compute(source.partitions[partition], scheduler="sync")
            yield block
