"""The scaling policy (``scaling_policy.GrowthWatch``) over generated timelines of time passing,
checkpoints committed and workers joining or leaving: it looks once per interval, asks for a
resize only when more eligible workers than ranks are there and a checkpoint was committed
since the group formed, then holds that decision; a fixed-size or full group never grows."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib._internal.driver.scaling_policy import GrowthWatch, ResizeDecision
from trainlib.config import ScalingConfig

INTERVAL_S = 10.0
STEP = st.one_of(
    st.tuples(st.just("wait"), st.floats(0.0, 25.0)),
    st.tuples(st.just("commit"), st.none()),
    st.tuples(st.just("workers"), st.integers(0, 8)),
    st.tuples(st.just("ask"), st.none()),
)


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

    watch = GrowthWatch(scaling, group_size, lambda: committed[0], eligible, clock=lambda: now[0])
    most = scaling.worker_range[1]
    next_look, fired_with = INTERVAL_S, None
    for kind, value in steps:
        if kind == "wait":
            now[0] += float(value)  # type: ignore[arg-type]
        elif kind == "commit":
            committed[0] = True
        elif kind == "workers":
            workers[0] = int(value)  # type: ignore[call-overload]
        else:
            if fired_with is None and group_size < most and now[0] >= next_look:
                next_look = now[0] + INTERVAL_S
                if committed[0] and workers[0] > group_size:
                    fired_with = workers[0]
            assert watch.due() is (fired_with is not None)
    expected = None if fired_with is None else ResizeDecision(group_size, fired_with, most)
    assert watch.decision == expected
    assert all(b - a >= INTERVAL_S for a, b in pairwise(looks))  # at most once a period
    if group_size >= most:
        assert looks == [] and watch.decision is None
