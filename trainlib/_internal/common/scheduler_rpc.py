"""The scheduler's RPC handle: the one place trainlib reaches past distributed's public API.

``Client.scheduler`` (and a worker's or nanny's ``.scheduler``) is the connection to the
scheduler that distributed's own objects use; it is not in distributed's documented API. It
is needed for:

- the scheduler's address without a round trip (``scheduler_address``);
- the workers the scheduler knows *now* (``workers``): ``Client.scheduler_info()`` returns the
  client's cached identity, which Dask's periodic refresh replaces with a worker-less one
  (``n_workers=0``) every 2 s, so one read right after such a refresh saw no worker at all;
- a lease (``Lock``, ``Semaphore``) bound to a given client rather than the default one
  (their ``scheduler_rpc=``, documented as "mostly used for testing"), registering one on a
  restarted scheduler (``register_lease``) and stopping a lease's refresh without
  ``close()``, which drops every client's leases of that name (``stop_refresh``);
- retiring a worker from its nanny (``retire_from_nanny``): a nanny plugin has no client.

``tests/trainlib/_internal/common/test_scheduler_rpc.py`` fails on a distributed where one
of these moved, so that an upgrade updates this module.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import dask
from dask.utils import parse_timedelta
from distributed import Client, Semaphore, get_worker

LeaseT = TypeVar("LeaseT", bound=Semaphore)


def _rpc(client: Client) -> Any:
    scheduler = client.scheduler
    if scheduler is None:
        raise RuntimeError("the Dask client is not connected to a scheduler")
    return scheduler


def scheduler_address(client: Client) -> str:
    """The address of ``client``'s scheduler (``tcp://host:8786``)."""
    return str(_rpc(client).address)


def worker_scheduler_address() -> str:
    """The address of the scheduler of the worker this runs in."""
    return str(get_worker().scheduler.address)


def workers(client: Client) -> dict[str, Any]:
    """The scheduler's workers now, asked directly: address -> the scheduler's information."""
    identity: dict[str, Any] = client.sync(_rpc(client).identity, n_workers=-1)
    found: dict[str, Any] = identity["workers"]
    return found


def lease(client: Client, kind: type[LeaseT], name: str, max_leases: int = 1) -> LeaseT:
    """A ``Lock`` or ``Semaphore`` named ``name`` on ``client``'s scheduler, bound to it."""
    if kind is Semaphore:
        return kind(max_leases, name, scheduler_rpc=_rpc(client), loop=client.loop)
    return kind(name, scheduler_rpc=_rpc(client), loop=client.loop)  # a Lock: one lease


def register_lease(client: Client, held: Semaphore) -> None:
    """Register ``held`` on the scheduler (a no-op where it is known): a scheduler restarted
    since it was made counts its refreshed leases under a name it does not know."""
    timeout = dask.config.get("distributed.scheduler.locks.lease-timeout")
    client.sync(
        _rpc(client).semaphore_register,
        name=held.name,
        max_leases=held.max_leases,
        lease_timeout=None if timeout == "inf" else parse_timedelta(timeout, "s"),
    )


def stop_refresh(held: Semaphore) -> None:
    """Stop ``held``'s lease refreshes (none where leases never expire)."""
    refresh = getattr(held, "refresh_callback", None)
    if refresh is not None:
        refresh.stop()


def retire_from_nanny(nanny: Any, address: str, stimulus_id: str) -> Awaitable[Any]:
    """Ask the scheduler, from ``address``'s nanny, to retire that worker: its data moved
    away, the worker removed without being closed (the nanny stops it)."""
    retiring: Awaitable[Any] = nanny.scheduler.retire_workers(
        workers=[address], close_workers=False, remove=True, stimulus_id=stimulus_id
    )
    return retiring
