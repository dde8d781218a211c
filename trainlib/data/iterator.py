"""DataIterator: one rank's shard of a dataset, as Ray Train's ``get_dataset_shard`` returns.

Blocks arrive from the rank's supervisor as the rank reads (one block requested ahead); they
are cut into batches here, optionally through a local shuffle buffer, and turned into tensors
on the rank's device.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from trainlib._internal.common.messages import CachePlan
from trainlib._internal.rank.process_globals import current_session
from trainlib._internal.rank.session import Session
from trainlib.data import _batching, _conversion
from trainlib.data.cache import CachedShard, ShardCollector

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from trainlib._internal.rank.transfer import DeviceStager

Block = dict[str, np.ndarray]
T = TypeVar("T")


class DataIterator:
    """One rank's shard of a dataset; each ``iter_batches()`` pass is one epoch.

    A split dataset (``DataConfig.datasets_to_split``) gives every rank the same number of
    rows per pass, different rows on each rank, in a partition order shuffled per pass; a
    dataset not split gives every rank all its rows, in order. Iterating over what
    ``iter_batches()`` or ``iter_torch_batches()`` returned starts a new pass each time.
    """

    def __init__(self, name: str, cache_plan: CachePlan | None = None) -> None:
        self._name = name
        self._passes = 0
        self._cache_plan = cache_plan
        self._cached: CachedShard | None = None  # after a complete first pass, if it fits

    def iter_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        batch_format: Literal["default", "numpy", "pandas"] = "default",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterable[Block] | Iterable[pd.DataFrame]:
        """Batches as dicts of column name -> numpy array (or DataFrames with ``"pandas"``).

        Args:
            prefetch_batches: Batches prepared ahead in a background thread (0: none). A kept
                shard's batches (``DataConfig(cache_shards=...)``) are made as they are asked
                for: each is one gather, cheaper than the hand-over from a thread.
            batch_size: Rows per batch; the last one may be smaller unless ``drop_last``.
                ``None`` yields the blocks as they arrive.
            batch_format: ``"default"``/``"numpy"`` or ``"pandas"``.
            drop_last: Drop the last batch of a pass if it is smaller than ``batch_size``.
            local_shuffle_buffer_size: Shuffle rows through a buffer holding at least this
                many rows: each batch is a random sample of the buffer.
            local_shuffle_seed: Seed of that shuffle (the same order every pass).
        """
        if batch_format not in ("default", "numpy", "pandas"):
            raise ValueError(
                f"iter_batches(batch_format={batch_format!r}) must be 'numpy' or 'pandas'."
            )

        def formatted(batches: Iterator[Block]) -> Iterator[Any]:
            if batch_format == "pandas":
                return (_conversion.to_pandas(b) for b in batches)
            return batches

        def start() -> Iterator[Any]:
            if self._cached is not None and batch_size is not None:  # made as asked for
                order = self._cached_order(local_shuffle_buffer_size, local_shuffle_seed)
                return formatted(self._cached.numpy_batches(order, batch_size, drop_last))
            batches = self._numpy_batches(
                batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed
            )
            return _prefetched(formatted(batches), prefetch_batches)

        return Passes(start)

    def iter_torch_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        dtypes: torch.dtype | Mapping[str, torch.dtype] | None = None,
        device: str | torch.device = "auto",
        collate_fn: Callable[[Block], Any] | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterable[Any]:
        """Batches as dicts of column name -> tensor on the rank's device.

        A column of fixed-shape arrays (an image column) is one stacked tensor. On a GPU the
        ``prefetch_batches`` batches prepared ahead are also copied ahead, from pinned memory on
        a side stream, so the copies overlap compute (from a kept shard in host memory too,
        though its batches are made in the rank's own thread).

        Args:
            dtypes: A torch dtype for every column, or one per column name.
            device: ``"auto"``: the rank's device (its GPU with ``use_gpu=True``).
            collate_fn: Turns each numpy batch into what the loop needs instead; tensors it
                returns (alone or in a dict) are moved to ``device``. Not with ``dtypes``.
            Others: as in ``iter_batches``.
        """
        if collate_fn is not None and dtypes is not None:
            raise ValueError(
                "iter_torch_batches() takes dtypes or collate_fn, not both; convert the "
                "dtypes inside collate_fn."
            )
        target = _conversion.target_device(device)
        stager = _stager(target)
        host = _conversion.host() if stager is not None else target  # where batches are made

        def convert(batch: Block) -> Any:
            if collate_fn is not None:
                return _conversion.move(collate_fn(batch), host)
            return {
                name: _conversion.tensor(name, values, dtypes, host)
                for name, values in batch.items()
            }

        def start() -> Iterator[Any]:
            if self._cached is not None and batch_size is not None and collate_fn is None:
                assert self._cache_plan is not None  # a shard is kept only with a plan
                order = self._cached_order(local_shuffle_buffer_size, local_shuffle_seed)
                on_device = self._cache_plan.location == "device" and target.type != "cpu"
                tensors = self._cached.torch_batches(
                    order, batch_size, drop_last, target if on_device else host, stager is not None
                )
                staged = _staged_ahead(tensors, prefetch_batches, None if on_device else stager)
                # Cast where the batch is used: a cast on the host would swap the pinned
                # gather for an unpinned copy, to be pinned again before it goes to the GPU.
                return (_conversion.cast(b, dtypes) for b in staged)
            batches = self._numpy_batches(
                batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed
            )
            return _delivered((convert(b) for b in batches), prefetch_batches, stager)

        return Passes(start)

    def _numpy_batches(
        self,
        batch_size: int | None,
        drop_last: bool,
        shuffle_buffer: int | None,
        shuffle_seed: int | None,
    ) -> Iterator[Block]:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1 (or None).")
        session = current_session(f"DataIterator({self._name!r}).iter_batches()")
        pass_id = self._passes  # the pass _blocks starts
        blocks = self._blocks(session)
        if batch_size is None:
            return blocks
        if shuffle_buffer is not None:
            # Seeded per rank and pass: each rank and each epoch draws its own order.
            entropy = (
                None if shuffle_seed is None else [shuffle_seed, session.spec.world_rank, pass_id]
            )
            rng = np.random.default_rng(entropy)
            return _batching.shuffled_batches(blocks, batch_size, drop_last, shuffle_buffer, rng)
        return _batching.batches(blocks, batch_size, drop_last)

    def _blocks(self, session: Session) -> Iterator[Block]:
        """This rank's blocks of a new pass, one block requested ahead; a first pass that
        ends is kept when the plan says so (a pass left unfinished keeps nothing)."""
        pass_id = self._passes
        self._passes += 1
        plan = self._cache_plan
        keep = plan is not None and self._cached is None
        collector = ShardCollector(self._name, plan) if keep and plan else None
        inbox = session.inbox(self._name)
        session.request_block(self._name, pass_id)
        while True:
            got, block = inbox.get()
            if got != pass_id:
                continue  # the answer to a request of a pass left unfinished
            if block is None:
                if collector is not None:
                    self._cached = collector.finish()
                return
            if isinstance(block, Exception):
                raise block
            session.request_block(self._name, pass_id)
            block = _writable(block)
            if collector is not None:
                collector.add(block)
            yield block

    def _cached_order(self, shuffle_buffer: int | None, shuffle_seed: int | None) -> np.ndarray:
        """The kept shard's row order for the next pass."""
        assert self._cached is not None and self._cache_plan is not None
        pass_id = self._passes
        self._passes += 1
        return self._cached.order(
            self._cache_plan, pass_id, shuffle_buffer is not None, shuffle_seed
        )


class Passes(Iterable[T]):
    """An iterable that starts a new pass every time it is iterated."""

    def __init__(self, start: Callable[[], Iterator[T]]) -> None:
        self._start = start

    def __iter__(self) -> Iterator[T]:
        return self._start()


def _writable(block: Block) -> Block:
    """The block with every array writable, as tensors need: an array that was read-only where
    the block was computed (``np.frombuffer``) arrives sharing the message's immutable bytes."""
    return {k: v if v.flags.writeable else v.copy() for k, v in block.items()}


def _prefetched(batches: Iterator[T], count: int) -> Iterator[T]:
    """``batches``, with up to ``count`` of them prepared ahead by a background thread."""
    if count < 1:
        yield from batches
        return
    ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=count)
    stopped = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stopped.is_set():
                    try:
                        ready.put(("batch", batch), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stopped.is_set():
                    return
            ready.put(("end", None))
        except BaseException as exc:  # handed to the consumer, which raises it
            ready.put(("error", exc))

    thread = threading.Thread(target=produce, daemon=True, name="trainlib-prefetch")
    thread.start()
    try:
        while True:
            kind, item = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stopped.set()


def _delivered(batches: Iterator[T], count: int, stager: DeviceStager | None) -> Iterator[T]:
    """``batches`` prefetched, and on a GPU copied to it ahead, on a side stream."""
    if stager is None:
        return _prefetched(batches, count)
    staged = _prefetched((stager.stage(b) for b in batches), count)
    return (stager.ready(s) for s in staged)


def _staged_ahead(batches: Iterator[Any], count: int, stager: DeviceStager | None) -> Iterator[Any]:
    """A kept shard's batches, made in the rank's own thread: each is one gather, cheaper than
    handing it over from a prefetch thread (which halved their rate). On a GPU ``count`` of
    them are still copied ahead, on the stager's side stream."""
    if stager is None:
        yield from batches
        return
    pending: collections.deque[Any] = collections.deque()
    for batch in batches:
        pending.append(stager.stage(batch))
        if len(pending) > count:
            yield stager.ready(pending.popleft())
    while pending:
        yield stager.ready(pending.popleft())


def _stager(device: torch.device) -> DeviceStager | None:
    if device.type != "cuda":
        return None
    from trainlib._internal.rank.transfer import DeviceStager

    return DeviceStager(device)
