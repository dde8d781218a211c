"""A concurrency slot held when the Prefect server restarts is freed when its lease expires:
the server keeps leases on disk (the stack's setting). With Prefect's default, leases in the
server's memory, the restart lost the lease and the slot stayed taken for good: in the soak, the
next training waited forever for the `dask-training` tag's only slot."""

from __future__ import annotations

import time
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.postgres_rig import Postgres
from tests.prefect_stack import PrefectServer, prefect_environment

LEASE_S = 60  # the shortest lease Prefect's API grants


def _active(name: str) -> int:
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


def test_a_slot_held_across_a_server_restart_is_freed_when_its_lease_expires(
    postgres: Postgres, tmp_path: Path
) -> None:
    env = prefect_environment(tmp_path, postgres.create_database("leases"))
    env["PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS"] = "2"
    server = PrefectServer(env, tmp_path / "server.log")
    server.start()
    try:
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            with get_client(sync_client=True) as client:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name="training", limit=1)
                )
                client.increment_concurrency_slots_with_lease(
                    names=["training"], slots=1, mode="concurrency", lease_duration=LEASE_S
                )
            taken = time.monotonic()
            server.stop()  # the holder's release never arrives: its process is gone too
            server.start()
            assert _active("training") == 1  # the lease is honoured until it expires
            deadline = taken + LEASE_S + 60
            while _active("training") and time.monotonic() < deadline:
                time.sleep(1)
            assert _active("training") == 0, "the slot stayed taken after its lease expired"
            assert time.monotonic() - taken >= LEASE_S - 1  # freed by expiry, not by the restart
    finally:
        server.stop()
