"""GPU claims: a run holds each GPU its ranks use, on the Dask scheduler, so that no other run
(of this driver or any other client of the cluster) is given that GPU while it runs.

A claim is a ``distributed.Lock`` (whose lease the client keeps alive) named after the GPU's
physical name (``devices.device_key``), taken without waiting when the run's ranks are placed,
kept across the run's attempts (a restart or an elastic re-form places its ranks on the GPUs
it holds) and released when the run ends. Runs place one at a time (a short lock of the
scheduler's, ``placing``), and a run that cannot place enough ranks keeps none of its claims:
two runs that each need both GPUs of a host never each take one. If the driver dies, the
scheduler frees its claims after ``distributed.scheduler.locks.lease-timeout`` (30 s by
default). The name of the run holding a GPU is kept in the scheduler's metadata, so a run
refused a GPU can say by whom. After a scheduler restart the claims it knew are gone: a claim
is taken afresh there (the ranks' own holds on their hosts, ``common/device_holds``, still keep
a GPU in use from being given twice). A lock's lease refreshes reach the restarted scheduler
too, which counts them under a name it does not know yet; so a lock is registered again
before it is released, or that lease would stay there and refuse the GPU to a fresh claim
until it timed out.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from distributed import Client, Lock

from trainlib._internal.common.scheduler_rpc import lease, register_lease, stop_refresh

_HOLDERS = "trainlib-gpu-holders"  # scheduler metadata: device key -> run name
_PLACING = "placing"  # the lock runs place under (device keys are "host/device")
_PLACING_WAIT_S = 10.0  # a placement takes well under a second
_LOCKS: weakref.WeakKeyDictionary[Client, dict[str, Lock]] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


class GpuClaims:
    """The GPUs a run holds; released on leaving the ``with`` block."""

    def __init__(self, client: Client, owner: str) -> None:
        self._client = client
        self._owner = owner
        self._held: dict[str, Lock] = {}
        # device key -> who holds it (a run of this scheduler, a rank of another), at the last try
        self.refused: dict[str, str] = {}

    def __enter__(self) -> GpuClaims:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def take(self, key: str) -> bool:
        """Hold the GPU ``key`` for this run; False (nothing held) if another run holds it."""
        if key in self._held:
            return True
        lock = self._acquired(key, timeout=0)  # not waiting
        if lock is None:
            holder = self._client.get_metadata([_HOLDERS, key], default=None)
            self.refused[key] = f"run {holder}" if holder else "another run"
            return False
        try:
            self._client.set_metadata([_HOLDERS, key], self._owner)
        except BaseException:  # the lock is held: never leave it behind
            _release(self._client, lock)
            raise
        self._held[key] = lock
        self.refused.pop(key, None)
        return True

    @contextmanager
    def placing(self) -> Iterator[bool]:
        """Whether this run may place now (no other run of the scheduler is placing), for
        the ``with`` block; False after waiting ``_PLACING_WAIT_S`` for another run."""
        lock = self._acquired(_PLACING, timeout=_PLACING_WAIT_S)
        try:
            yield lock is not None
        finally:
            if lock is not None:
                _release(self._client, lock)

    def keep(self, keys: set[str]) -> None:
        """Release every held GPU not in ``keys`` (those the placement did not use)."""
        for key in set(self._held) - keys:
            _release(self._client, self._held.pop(key))

    def release(self) -> None:
        """Release every GPU this attempt holds."""
        self.keep(set())

    @property
    def held(self) -> set[str]:
        """The device keys held now."""
        return set(self._held)

    def _acquired(self, key: str, timeout: float) -> Lock | None:
        """The lock ``key`` acquired within ``timeout`` seconds, or None. A scheduler
        restarted since the lock was made does not know it: a new one is made."""
        lock = _lock(self._client, key)
        try:
            return lock if lock.acquire(timeout=timeout) else None
        except RuntimeError as error:
            if "not known" not in str(error):
                raise
            lock = _lock(self._client, key, fresh=True)
            return lock if lock.acquire(timeout=timeout) else None


def _lock(client: Client, key: str, fresh: bool = False) -> Lock:
    """``client``'s lock for ``key`` (a Lock keeps a periodic callback for its lifetime, so
    one per client and device is made, not one per try; ``fresh``: a new one, the old one's
    callback stopped: never ``Lock.close``, which drops every client's leases of that name)."""
    with _LOCKS_GUARD:
        locks = _LOCKS.setdefault(client, {})
        if fresh and key in locks:
            stop_refresh(locks.pop(key))
        if key not in locks:
            locks[key] = lease(client, Lock, f"trainlib-gpu/{key}")
        return locks[key]


def _release(client: Client, lock: Lock) -> None:
    """Release ``lock``, registered on the scheduler first (a no-op where it is known): after a
    restart, the scheduler has counted the lock's refreshed lease under an unknown name, and
    only a release of a registered lock removes it."""
    register_lease(client, lock)
    lock.release()
