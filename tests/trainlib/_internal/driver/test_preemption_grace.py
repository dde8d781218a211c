"""The preemption grace (``preemption_grace``) over generated timelines of notices, commits,
ended ranks and time: reports are relaxed to the survivors only when rank 0 survives and the
run asked for it, and the survivors go on only within the grace, until they commit a
checkpoint, and only while every ended rank is a preempted one."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib._internal.driver.preemption_grace import PreemptionGrace
from trainlib.config import FailureConfig


@dataclass
class _Latest:
    index: int


class _Manager:
    """The run's checkpoint manager, as the grace reads it: the latest committed index."""

    def __init__(self, latest: int | None) -> None:
        self.latest = None if latest is None else _Latest(latest)

    def commit(self) -> None:
        self.latest = _Latest(0 if self.latest is None else self.latest.index + 1)


class _Collector:
    def __init__(self) -> None:
        self.relaxed: list[set[int]] = []

    def relax_to(self, ranks: set[int]) -> None:
        self.relaxed.append(set(ranks))


STEP = st.one_of(
    st.tuples(st.just("notice"), st.sets(st.integers(0, 3), min_size=1)),
    st.tuples(st.just("commit"), st.none()),
    st.tuples(st.just("wait"), st.floats(0.0, 8.0)),
    st.tuples(st.just("ended"), st.sets(st.integers(0, 3), min_size=1)),
)


@settings(max_examples=400, deadline=None)
@given(
    world=st.integers(1, 4),
    relax=st.booleans(),
    grace_s=st.sampled_from([0.0, 5.0, 20.0]),
    latest=st.none() | st.integers(0, 3),
    steps=st.lists(STEP, max_size=15),
)
def test_the_grace_over_generated_timelines(
    world: int,
    relax: bool,
    grace_s: float,
    latest: int | None,
    steps: list[tuple[str, object]],
) -> None:
    now = [100.0]
    manager, collector = _Manager(latest), _Collector()
    config = FailureConfig(relax_collectives_on_preemption=relax, preemption_grace_s=grace_s)
    grace = PreemptionGrace(config, collector, manager, world, clock=lambda: now[0])  # type: ignore[arg-type]
    ranks = set(range(world))
    preempted: set[int] = set()
    at_notice: int | None = None  # the latest index when the first notice came
    ends_at: float | None = None  # the grace's end, from the first time it held
    relaxed: list[set[int]] = []
    for kind, value in steps:
        if kind == "notice":
            told = set(value) & ranks or {0}  # type: ignore[call-overload]
            if not told <= preempted:
                if at_notice is None:
                    at_notice = manager.latest.index if manager.latest else -1
                preempted |= told
                if relax and 0 not in preempted:
                    relaxed.append(ranks - preempted)
            grace.notice(told)
        elif kind == "commit":
            manager.commit()
        elif kind == "wait":
            now[0] += float(value)  # type: ignore[arg-type]
        else:
            ended = set(value) & ranks or {0}  # type: ignore[call-overload]
            may = grace_s > 0 and ended <= preempted and bool(ranks - ended)
            if may and ends_at is None:
                ends_at = now[0] + grace_s
            since = -1 if at_notice is None else at_notice
            committed = manager.latest is not None and manager.latest.index > since
            expected = may and not committed and ends_at is not None and now[0] < ends_at
            assert grace.holds(ended) is expected
        assert collector.relaxed == relaxed
