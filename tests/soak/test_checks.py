"""The soak's checks of alerts, on generated nights (no services): one alert per failed run and
per incident, none for a completed run, a Cancelled run always a problem."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st
from prefect.client.schemas.objects import FlowRun, State, StateType

from tests.soak.checks import alert_problems, incident_problems

ENDS = [StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED]
SENTINEL = ["Prefect server not ready for 45 s", "service s3: unhealthy for 45 s"]


@given(
    ends=st.lists(st.sampled_from(ENDS), min_size=1, max_size=4),
    alerted=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    incidents=st.lists(st.sampled_from(SENTINEL), max_size=3),
)
def test_checks_find_every_missing_doubled_or_wrong_alert(
    ends: list[StateType], alerted: list[int], incidents: list[str]
) -> None:
    runs = [
        FlowRun(flow_id=uuid.uuid4(), name=f"run-{i}", state=State(type=end))
        for i, end in enumerate(ends)
    ]
    alerts = [
        {"subject": f"train-cifar/nightly: run {run.name} {run.state.name}"}  # type: ignore[union-attr]
        for run, times in zip(runs, alerted, strict=False)
        for _ in range(times)
    ] + [{"subject": subject} for subject in incidents]
    wrong = {run.name for run, times in zip(runs, alerted, strict=False) if _wrong(run, times)}
    found = alert_problems(runs, [a for a in alerts if "run " in a["subject"]])
    assert {p.split(" ")[0] for p in found} == wrong, (found, wrong)
    doubled = {s for s in incidents if incidents.count(s) > 1}
    assert len(incident_problems(alerts)) == len(doubled)


def _wrong(run: FlowRun, times: int) -> bool:
    """What the checks must flag: a Cancelled run; a failed one alerted other than once; any
    other alerted at all."""
    end = run.state.type  # type: ignore[union-attr]
    failed = end in (StateType.FAILED, StateType.CRASHED)
    return end == StateType.CANCELLED or (times != 1 if failed else times > 0)
