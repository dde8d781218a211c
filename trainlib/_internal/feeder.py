"""Runs in a rank's supervisor: computes the rank's share of each pass on Dask, sends it on.

A rank asks for the next block of a pass over a dataset; a thread per dataset answers with the
rows the split plan (``split.py``) gives this rank, computed by Dask tasks (the window's
partition ``i`` next to rank ``i``'s worker) and fetched by the supervisor. While the rank reads
one window, the next is already being computed: with the rank's own request for the next
block, at most one block is in flight to it. A worker lost while computing costs a recompute
(Dask reruns the lost tasks); the pass goes on.
"""

from __future__ import annotations

import queue
import threading
import traceback
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from distributed import Client, Future

from trainlib._internal.datasets import Block, DatasetSource, num_rows, take_rows
from trainlib._internal.split import EqualSplit, Segment, pass_order, windows
from trainlib._internal.waiting import result_within
from trainlib.errors import DatasetError

Send = Callable[[tuple[str, Any]], None]
_WAIT_S = 0.5


@dataclass(frozen=True)
class FeedPlan:
    """What a rank's feeder needs: the datasets, and where the group's ranks run."""

    sources: tuple[DatasetSource, ...]
    world_rank: int
    worker_addresses: tuple[str, ...]  # by world rank
    shuffle_seed: int | None
    attempt_key: int  # differs between attempts, so a restarted pass gets a new order


class Feeder:
    """Answers a rank's ``data_next`` requests, one thread per dataset."""

    def __init__(self, plan: FeedPlan, client: Client, send: Send) -> None:
        self._feeds = {s.name: _DatasetFeed(s, plan, client, send) for s in plan.sources}

    def request(self, name: str, pass_id: int) -> None:
        """The rank wants the next block of pass ``pass_id`` over dataset ``name``."""
        self._feeds[name].requests.put(pass_id)

    def close(self) -> None:
        """Stop every thread and release what they hold on the cluster."""
        for feed in self._feeds.values():
            feed.stop()


class _DatasetFeed:
    def __init__(self, source: DatasetSource, plan: FeedPlan, client: Client, send: Send) -> None:
        self._source = source
        self._plan = plan
        self._client = client
        self._send = send
        self.requests: queue.Queue[int | None] = queue.Queue()
        self._stopped = threading.Event()
        self._held: dict[int, Future[Block]] = {}
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"feed-{source.name}")
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; it releases what it holds (at most one wait of ``_WAIT_S`` later)."""
        self._stopped.set()
        self.requests.put(None)

    def _serve(self) -> None:
        current: tuple[int, Generator[Block, None, None]] | None = None
        try:
            while (pass_id := self.requests.get()) is not None:
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
                self._send(("data", (self._source.name, pass_id, block)))
        except (_Stopped, OSError):
            pass  # the rank ended (its connection is closed); nobody waits for the block
        finally:
            if current is not None:
                current[1].close()

    def _blocks(self, pass_id: int) -> Generator[Block, None, None]:
        """The blocks of this rank's share of one pass, in order."""
        plan, source = self._plan, self._source
        world_size = len(plan.worker_addresses) if source.split else 1
        order = pass_order(len(source.partitions), self._seed(pass_id))
        split = EqualSplit(world_size, plan.world_rank if source.split else 0)
        lengths: dict[int, Future[int]] = {}
        rows: dict[int, int] = {}
        pending = windows(order, world_size)
        window = next(pending, None)
        if window is not None:
            self._compute(window, lengths)
        try:
            while window is not None:
                following = next(pending, None)
                if following is not None:
                    self._compute(following, lengths)  # computes while this window is read
                sizes = [(p, self._wait(lengths.pop(p))) for p in window]
                rows.update(sizes)
                for segment in split.take(sizes):
                    yield self._fetch(segment, rows[segment.partition])
                keep = {s.partition for s in split.carry} | set(following or ())
                self._release({p for p in window if p not in keep})
                window = following
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
            lengths[partition] = self._client.submit(num_rows, future, pure=False)

    def _fetch(self, segment: Segment, partition_rows: int) -> Block:
        future = self._held[segment.partition]
        if segment.start == 0 and segment.stop == partition_rows:
            return self._wait(future)
        part = self._client.submit(take_rows, future, segment.start, segment.stop, pure=False)
        return self._wait(part)

    def _wait(self, future: Future[Any]) -> Any:
        """The future's result; raises ``_Stopped`` once the feeder is stopped."""
        try:
            return result_within(future, _WAIT_S, give_up=self._stopped.is_set)
        except TimeoutError:
            raise _Stopped from None

    def _release(self, partitions: set[int]) -> None:
        """Drop this rank's interest in partitions (another rank may still hold them)."""
        for partition in partitions:
            if (future := self._held.pop(partition, None)) is not None:
                future.release()


class _Stopped(Exception):
    """The feeder was stopped while waiting for the cluster."""
