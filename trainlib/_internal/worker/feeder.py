"""Runs in a rank's supervisor: computes the rank's share of each pass on Dask, sends it on.

A rank asks for the next block of a pass over a dataset; a thread per dataset answers with the
rows the split plan (``rows_per_rank.py``) gives this rank, computed by Dask tasks (the window's
partition ``i`` next to rank ``i``'s worker) and fetched by the supervisor. While the rank reads
one window, the next ``_WINDOWS_AHEAD`` are already being computed; with the rank's own request
for the next block, at most one block is in flight to it. A worker lost while computing costs a
recompute (Dask reruns the lost tasks); the pass goes on.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import traceback
import zlib
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, cast

from distributed import Client, Future, Worker, get_worker

from trainlib import _retries as retries
from trainlib._internal.common import shared_blocks
from trainlib._internal.common.datasets import Block, DatasetSource, num_rows, take_rows
from trainlib._internal.common.messages import DataBlock, FeedPlan
from trainlib._internal.common.waiting import Completions, result_within
from trainlib._internal.worker.block_pickle import Protocol5
from trainlib._internal.worker.rows_per_rank import EqualSplit, Segment, pass_order, windows
from trainlib.errors import DatasetError

logger = logging.getLogger(__name__)
Send = Callable[[DataBlock], None]
_WAIT_S = 0.5
# Windows computed ahead of the one the rank reads: with one, benchmarks/ingest.py delivered
# about 10% fewer images/s into a rank (the supervisor waited on the cluster more often).
_WINDOWS_AHEAD = 2
_JOIN_S = 5.0  # a stopped thread ends within _WAIT_S unless a send to a dead rank hangs


class Feeder:
    """Answers a rank's ``DataRequest``s, one thread per dataset."""

    def __init__(self, plan: FeedPlan, client: Client, send: Send) -> None:
        self._feeds = {s.name: _DatasetFeed(s, plan, client, send) for s in plan.sources}

    def request(self, name: str, pass_id: int) -> None:
        """The rank wants the next block of pass ``pass_id`` over dataset ``name``."""
        self._feeds[name].requests.put(pass_id)

    def close(self) -> None:
        """Stop every thread; each releases what it holds on the cluster as it ends."""
        for feed in self._feeds.values():
            feed.stop()

    def join(self, timeout_s: float = _JOIN_S) -> None:
        """Wait (bounded) until every thread has ended and released its partitions.

        Called once the rank is gone, so that a run's next attempt, started when this
        supervisor's task ends, finds none of this attempt's partitions still held.
        """
        deadline = time.monotonic() + timeout_s
        for feed in self._feeds.values():
            feed.join(max(0.0, deadline - time.monotonic()))


class _DatasetFeed:
    def __init__(self, source: DatasetSource, plan: FeedPlan, client: Client, send: Send) -> None:
        self._source = source
        self._plan = plan
        self._client = client
        self._send = send
        self.requests: queue.Queue[int | None] = queue.Queue()
        self._stopped = threading.Event()
        self._held: dict[int, Future[Block]] = {}
        self._worker = _this_worker()
        # Blocks go to the rank in shared memory when the rank runs on this host: always, as
        # this feeder runs in the Dask worker that started the rank.
        self._slots = shared_blocks.SharedSlots() if shared_blocks.available() else None
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"feed-{source.name}")
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; it releases what it holds (at most one wait of ``_WAIT_S`` later)."""
        self._stopped.set()
        self.requests.put(None)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        current: tuple[int, Generator[Block, None, None]] | None = None
        try:
            while (pass_id := self.requests.get()) is not None:
                if current is not None and current[0] == pass_id and self._slots is not None:
                    # The rank asks for the next block of a pass once it has the last one, and
                    # reads messages in order: it has read every block sent so far.
                    self._slots.received()
                if current is None or current[0] != pass_id:
                    if current is not None:
                        current[1].close()  # a pass the rank left unfinished
                    current = (pass_id, self._blocks(pass_id))
                try:
                    block: Block | DatasetError | None = next(current[1], None)
                except _Stopped:
                    raise
                except Exception as exc:  # the rank raises it, so the run fails with it
                    block = self._error(exc)
                    current = None
                self._send(DataBlock(self._source.name, pass_id, self._payload(block)))
                if block is None and self._slots is not None:
                    self._slots.release_free()  # the pass ended: hold no memory until the next
        except (_Stopped, OSError):
            pass  # the rank ended (its connection is closed); nobody waits for the block
        finally:
            if current is not None:
                current[1].close()
            if self._slots is not None:
                self._slots.close()

    def _payload(self, block: Block | DatasetError | None) -> Any:
        """What the message carries: a block in shared memory where it can be, else pickled
        (an error or the end of the pass as it is)."""
        if not isinstance(block, dict):
            return block
        if self._slots is not None and shared_blocks.shareable(block):
            try:
                return self._slots.put(block)
            except OSError:  # no memory for the file: this block goes pickled
                pass
        return Protocol5(block)

    def _blocks(self, pass_id: int) -> Generator[Block, None, None]:
        """The blocks of this rank's share of one pass, in order."""
        plan, source = self._plan, self._source
        world_size = len(plan.worker_addresses) if source.split else 1
        order = pass_order(len(source.partitions), self._seed(pass_id))
        split = EqualSplit(world_size, plan.world_rank if source.split else 0)
        lengths: dict[int, Future[int]] = {}
        rows: dict[int, int] = {}
        pending = windows(order, world_size)
        ahead: deque[list[int]] = deque()
        try:
            while True:
                for window in itertools.islice(pending, _WINDOWS_AHEAD + 1 - len(ahead)):
                    self._compute(window, lengths)  # computes while earlier windows are read
                    ahead.append(window)
                if not ahead:
                    return
                window = ahead.popleft()
                sizes = [(p, self._num_rows(p, lengths)) for p in window]
                rows.update(sizes)
                for segment in split.take(sizes):
                    yield self._fetch(segment, rows[segment.partition])
                keep = {s.partition for s in split.carry}
                self._release({p for p in window if p not in keep})
        finally:
            self._release(set(self._held))

    def _error(self, exc: Exception) -> DatasetError:
        """A computing error as the rank will raise it: picklable, with the worker's trace."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        return DatasetError(
            f"Computing datasets[{self._source.name!r}] for rank {self._plan.world_rank} "
            f"failed: {type(exc).__name__}: {exc}\n{trace}"
        )

    def _seed(self, pass_id: int) -> int | None:
        seed = self._plan.shuffle_seed
        if seed is None or not self._source.split:
            return None
        return zlib.crc32(f"{seed}:{self._plan.attempt_key}:{pass_id}".encode())

    def _compute(self, window: list[int], lengths: dict[int, Future[int]]) -> None:
        """Start computing a window's partitions, partition ``i`` next to rank ``i``."""
        addresses = self._plan.worker_addresses
        for i, partition in enumerate(window):
            near = addresses[i] if self._source.split else addresses[self._plan.world_rank]
            future = self._client.compute(
                self._source.partitions[partition], workers=[near], allow_other_workers=True
            )
            self._held[partition] = future
            if self._source.lengths is None:
                lengths[partition] = self._client.submit(num_rows, future, pure=False)

    def _num_rows(self, partition: int, lengths: dict[int, Future[int]]) -> int:
        """A partition's rows: from Dask's metadata where it has them (no task to count them
        and wait on), else counted on the cluster."""
        if self._source.lengths is not None:
            return self._source.lengths[partition]
        return int(self._wait(lengths.pop(partition)))

    def _fetch(self, segment: Segment, partition_rows: int) -> Block:
        """The segment's rows; raises if the partition has fewer than its metadata said."""
        future = self._held[segment.partition]
        whole = segment.start == 0 and segment.stop == partition_rows
        block: Block | None = self._in_process(future)
        if block is not None:
            block = block if whole else take_rows(block, segment.start, segment.stop)
        else:
            if not whole:
                future = self._client.submit(
                    take_rows, future, segment.start, segment.stop, pure=False
                )
            block = self._wait(future)
        if num_rows(block) != segment.num_rows:
            raise DatasetError(
                f"Partition {segment.partition} of datasets[{self._source.name!r}] has "
                f"{num_rows(block)} rows where rows {segment.start}:{segment.stop} were planned "
                "from its Dask metadata (chunks or Parquet row counts); give the dataset its "
                "true row counts."
            )
        return block

    def _in_process(self, future: Future[Block]) -> Block | None:
        """The computed block from the memory of a Dask worker of this process, else None.

        The feeder runs in its rank's Dask worker, where the rank's partitions are computed
        (and with the default LocalCluster every worker is a thread of this process): taken
        from the worker's memory, a block is not sent to this same process over the cluster's
        TCP connection and the event loop the scheduler also runs on. A failed or cancelled
        computation, or a block held elsewhere, goes the usual way (``_wait``).
        """
        if self._worker is None:
            return None
        completions = Completions([future])
        while not future.done():
            if not completions.wait(_WAIT_S) and self._stopped.is_set():
                raise _Stopped
        if future.status != "finished":
            return None
        # its own worker first: other workers of this process (a WeakSet) only on a miss
        for worker in itertools.chain((self._worker,), Worker._instances):
            try:
                block = worker.data[future.key]
            except (KeyError, AttributeError):
                continue
            return cast(Block, block)
        return None

    def _wait(self, future: Future[Any]) -> Any:
        """The future's result; raises ``_Stopped`` once the feeder is stopped. A computation
        that failed transiently (its storage out of reach) is computed again, with its failed
        dependencies, for up to ``retries.TOTAL_S``: an outage of the storage the data is read
        from costs a wait, not the run."""
        started, delay = time.monotonic(), 1.0
        while True:
            try:
                return result_within(future, _WAIT_S, give_up=self._stopped.is_set)
            except TimeoutError:
                raise _Stopped from None
            except Exception as exc:
                if not retries.is_transient(exc) or time.monotonic() - started > retries.TOTAL_S:
                    raise
                logger.warning(
                    "Computing datasets[%r] failed (%s: %s); computed again in %.0f s",
                    self._source.name,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            if self._stopped.wait(delay):
                raise _Stopped
            delay = min(delay * 2, retries.MAX_WAIT_S)
            future.retry()

    def _release(self, partitions: set[int]) -> None:
        """Drop this rank's interest in partitions (another rank may still hold them)."""
        for partition in partitions:
            if (future := self._held.pop(partition, None)) is not None:
                future.release()


def _this_worker() -> Worker | None:
    """The Dask worker this feeder runs in (it is made in its supervisor's task), if any."""
    try:
        return get_worker()
    except ValueError:
        return None


class _Stopped(Exception):
    """The feeder was stopped while waiting for the cluster."""
