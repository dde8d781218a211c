"""The chaos soak, short (CI's): six nights, a different fault each, on the rig's real services;
night 5 starts a manual run beside the nightly while the Prefect server is down. Every check of
tests/soak/checks.py holds after every night (``make soak`` runs the full month)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import skip_or_fail
from tests.postgres_rig import unavailable_reason
from tests.soak.rig import Bounds
from tests.soak.soak import run_soak

NIGHTS = [
    "worker tree killed",
    "rank killed",
    "registry reply lost",
    "PostgreSQL restarted",
    "Prefect server down",  # with a concurrent manual run (every fifth night)
    "Dask worker killed",
]


# a night counts as lost after 8 minutes (its runs take under 3), and the soak stops there:
# a stuck stack is reported by the soak, not cut off by the timeout
@pytest.mark.timeout(1800)
def test_soak_six_nights_under_faults_lose_nothing_and_alert_each_failure(tmp_path: Path) -> None:
    if (reason := unavailable_reason()) is not None:
        skip_or_fail(reason)
    soak = run_soak(tmp_path, len(NIGHTS), seed=7, faults=NIGHTS, bounds=Bounds(night_s=480))
    print(soak.table())
    assert soak.problems == []
    nights = [n for n in soak.nights if n.injected is not False]  # a night that struck nothing
    assert [n.fault for n in nights] == [*NIGHTS, "none"]  # was run again (the checks)
    assert all(n.injected for n in nights[:-1])
    assert nights[0].outcomes["nightly"] == "Crashed"  # and alerted once (the checks)
    assert all(n.outcomes["nightly"] == "Completed" for n in nights[1:])
    assert nights[4].outcomes["manual"] == "Completed"
    assert soak.trainings >= len(NIGHTS)  # the overlap watch saw the trainings it judged
