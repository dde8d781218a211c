"""The scaling policy (``scaling_policy.ScalingPolicy``) over generated timelines of time
passing, checkpoints committed, workers joining or leaving and polls of the group: it looks
once per interval, asks for a resize only when more eligible workers than ranks are there, a
checkpoint was committed since the group formed and no rank ended; a fixed-size or full group
never grows."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib._internal.driver.group_status import GroupStatus
from trainlib._internal.driver.scaling_policy import ResizeDecision, ScalingPolicy
from trainlib.config import ScalingConfig
from trainlib.errors import RankFailure

INTERVAL_S = 10.0
STEP = st.one_of(
    st.tuples(st.just("wait"), st.floats(0.0, 25.0)),
    st.tuples(st.just("commit"), st.none()),
    st.tuples(st.just("workers"), st.integers(0, 8)),
    st.tuples(st.just("poll"), st.sampled_from(["running", "rank ended", "rank failed"])),
)


def status(size: int, kind: object) -> GroupStatus:
    if kind == "running":
        return GroupStatus(size)
    failures = {0: RankFailure(0, "host", "exception", "boom")} if kind == "rank failed" else {}
    return GroupStatus(size, frozenset({0}), failures)


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.sampled_from([3, (1, 4), (2, 6), (4, 4)]),
    group_size=st.integers(1, 6),
    steps=st.lists(STEP, max_size=20),
)
def test_growth_over_generated_timelines(
    sizes: int | tuple[int, int], group_size: int, steps: list[tuple[str, object]]
) -> None:
    scaling = ScalingConfig(num_workers=sizes, elastic_resize_monitor_interval_s=INTERVAL_S)
    now, workers, committed = [0.0], [group_size], [False]
    looks: list[float] = []

    def eligible() -> int:
        looks.append(now[0])
        return workers[0]

    policy = ScalingPolicy(
        scaling, group_size, lambda: committed[0], eligible, clock=lambda: now[0]
    )
    most = scaling.worker_range[1]
    next_look = INTERVAL_S
    for kind, value in steps:
        if kind == "wait":
            now[0] += float(value)  # type: ignore[arg-type]
        elif kind == "commit":
            committed[0] = True
        elif kind == "workers":
            workers[0] = int(value)  # type: ignore[call-overload]
        else:
            expected = None
            if value == "running" and group_size < most and now[0] >= next_look:
                next_look = now[0] + INTERVAL_S
                if committed[0] and workers[0] > group_size:
                    expected = ResizeDecision(group_size, workers[0], most)
            assert policy.decide(status(group_size, value)) == expected
            if expected is not None:
                break  # the controller leaves Running: the group is re-formed
    assert all(b - a >= INTERVAL_S for a, b in pairwise(looks))  # at most once a period
    if group_size >= most:
        assert looks == []
