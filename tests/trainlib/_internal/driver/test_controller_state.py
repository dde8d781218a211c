"""A run's lifecycle (``controller_state``), driven by generated sequences of states: each
change reaches every listener once as (previous, current), a terminal state is never left,
and nothing is told of a refused change."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib._internal.driver.controller_state import (
    Aborted,
    ControllerState,
    Errored,
    Finished,
    Initializing,
    Lifecycle,
    Resizing,
    Restarting,
    Running,
    Scheduling,
)
from trainlib._internal.driver.failure_policy import FailureDecision
from trainlib._internal.driver.scaling_policy import ResizeDecision
from trainlib.errors import RankFailure, WorkerGroupError

DECISION = FailureDecision(
    True,
    "failure",
    1,
    2,
    WorkerGroupError({1: RankFailure(1, "host", "exit", "rank 1 exited with code 1", time=0.0)}),
)
ON_THE_WAY = st.one_of(
    st.builds(Scheduling, st.integers(1, 9)),
    st.builds(Running, st.integers(1, 9), st.integers(1, 8), st.sampled_from(["scratch", "c"])),
    st.builds(Resizing, st.builds(ResizeDecision, st.just(2), st.just(4), st.just(8))),
    st.just(Restarting(DECISION)),
)
TERMINAL = st.one_of(
    st.just(Finished()),
    st.builds(Errored, st.sampled_from(["WorkerGroupError", "ValueError"])),
    st.builds(Aborted, st.sampled_from(["KeyboardInterrupt", "RunCancelled"])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ON_THE_WAY, max_size=12), TERMINAL, st.lists(ON_THE_WAY | TERMINAL, max_size=3))
def test_each_change_is_told_once_and_a_terminal_state_is_never_left(
    states: list[ControllerState], end: ControllerState, after: list[ControllerState]
) -> None:
    lifecycle = Lifecycle("run")
    told: list[tuple[ControllerState, ControllerState]] = []
    lifecycle.listeners.append(lambda previous, current: told.append((previous, current)))
    for state in [*states, end]:
        lifecycle.enter(state)
    expected = list(zip([Initializing(), *states], [*states, end], strict=True))
    assert told == expected and lifecycle.state == end and end.is_terminal
    for state in after:
        with pytest.raises(RuntimeError, match="already"):
            lifecycle.enter(state)
    assert lifecycle.state == end and told == expected


def test_only_the_end_states_are_terminal_and_each_says_what_it_is() -> None:
    states = [
        Initializing(),
        Scheduling(1),
        Running(1, 2, "scratch"),
        Resizing(ResizeDecision(2, 4, 8)),
        Restarting(DECISION),
        Finished(),
        Errored("ValueError"),
        Aborted("KeyboardInterrupt"),
    ]
    assert [s.is_terminal for s in states] == [False] * 5 + [True] * 3
    described = [s.describe() for s in states]
    assert all(described) and len(set(described[:-2])) == len(described) - 2
    assert "4 eligible Dask workers for its 2 ranks (up to 8)" in described[3]
    assert "failure 1: " in described[4]
