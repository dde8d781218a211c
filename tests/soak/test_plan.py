"""The soak's plan: which fault strikes at which phase, night by night (no services)."""

from __future__ import annotations

import pytest

from tests.soak.faults import FAULTS
from tests.soak.soak import pairs, plan


@pytest.mark.parametrize("disk", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_plan_a_month_hits_every_fault_at_every_phase_it_can(seed: int, disk: bool) -> None:
    every = pairs(disk)
    month = plan(len(every), seed, None, disk)
    assert sorted(month) == sorted(every)  # each pair once
    assert ("MLflow down", "train") in month and ("Prefect server down", "train") in month
    assert any(f.needs_root for f in FAULTS.values())
    assert disk == any(FAULTS[fault].needs_root for fault, _ in month)
    longer = plan(len(every) + 5, seed, None, disk)
    assert longer[: len(every)] == month and set(longer[len(every) :]) <= set(every)


def test_plan_is_the_seeds_and_differs_between_seeds() -> None:
    assert plan(31, 3, None, False) == plan(31, 3, None, False)
    assert len({tuple(plan(31, seed, None, False)) for seed in range(10)}) == 10


def test_plan_given_faults_strike_in_order_at_phases_they_can() -> None:
    given = ["rank killed", "S3 down", "network cut"]
    nights = plan(7, 0, given, False)
    assert [fault for fault, _ in nights] == [*given, *given, given[0]]
    assert all(phase in FAULTS[fault].phases for fault, phase in nights)
