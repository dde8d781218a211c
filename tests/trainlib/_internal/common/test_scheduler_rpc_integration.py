"""The installed distributed still answers what ``scheduler_rpc`` asks its scheduler, on a
real in-process cluster: a distributed that moved one of them fails here, so that an upgrade
updates the adapter rather than breaking GPU claims, worker selection or the training slot."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from distributed import Client, LocalCluster, Lock, Semaphore

from trainlib._internal.common import scheduler_rpc


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, Client]]:
    with (
        LocalCluster(n_workers=2, processes=False, dashboard_address=None) as local,
        Client(local) as client,
    ):
        yield local, client


def test_the_address_and_the_workers_are_the_schedulers_own(
    cluster: tuple[LocalCluster, Client],
) -> None:
    local, client = cluster
    assert scheduler_rpc.scheduler_address(client) == local.scheduler_address
    assert set(scheduler_rpc.workers(client)) == set(local.scheduler.workers)
    assert all("host" in info for info in scheduler_rpc.workers(client).values())


def test_a_closed_client_is_told_apart(cluster: tuple[LocalCluster, Client]) -> None:
    local, _ = cluster
    client = Client(local)
    client.close()
    with pytest.raises(RuntimeError, match="not connected"):
        scheduler_rpc.scheduler_address(client)


@pytest.mark.parametrize("kind", [Lock, Semaphore])
def test_a_lease_is_bound_to_its_client_and_counted_by_the_scheduler(
    cluster: tuple[LocalCluster, Client], kind: type[Semaphore]
) -> None:
    _, client = cluster
    name = f"rpc-test-{kind.__name__}"
    first = scheduler_rpc.lease(client, kind, name, max_leases=2)
    assert first.max_leases == (1 if kind is Lock else 2)
    others = [scheduler_rpc.lease(client, kind, name, max_leases=2) for _ in range(2)]
    assert first.acquire(timeout=5)
    if kind is Semaphore:
        assert others[0].acquire(timeout=5)
    assert not others[-1].acquire(timeout=0.2)  # every lease held
    scheduler_rpc.register_lease(client, first)  # known already: changes nothing
    first.release()
    assert others[-1].acquire(timeout=5)
    others[-1].release()
    if kind is Semaphore:
        others[0].release()


def test_a_stopped_refresh_stops(cluster: tuple[LocalCluster, Client]) -> None:
    _, client = cluster
    held = scheduler_rpc.lease(client, Lock, "rpc-test-refresh")
    refresh = held.refresh_callback
    client.sync(asyncio.sleep, 0)  # the loop has run the callback's start
    assert refresh.is_running()
    scheduler_rpc.stop_refresh(held)
    assert not refresh.is_running()


def test_retiring_a_worker_from_its_nanny_removes_it(cluster: tuple[LocalCluster, Client]) -> None:
    """A nanny's scheduler handle is the same RPC as the client's: the call is made on it."""
    local, client = cluster
    address = sorted(local.scheduler.workers)[-1]
    nanny = SimpleNamespace(scheduler=client.scheduler)

    async def retire() -> object:
        return await scheduler_rpc.retire_from_nanny(nanny, address, "rpc-test")

    client.sync(retire)
    assert address not in scheduler_rpc.workers(client)
