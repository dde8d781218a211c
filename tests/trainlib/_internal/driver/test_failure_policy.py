"""The failure policy on polls of the worker group (``GroupStatus``): nothing while no rank
failed; wait or stop the others while some still run; once every rank ended, restart or raise
with the reason and the budget left, preemptions counted apart while their budget lasts."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainlib import FailureConfig, RankFailure
from trainlib._internal.driver.failure_policy import FailureDecision, FailurePolicy, Pending
from trainlib._internal.driver.group_status import GroupStatus


def failure(rank: int = 0, kind: str = "exception") -> RankFailure:
    return RankFailure(rank, "host", kind, "RuntimeError: boom")  # type: ignore[arg-type]


def ended(kind: str = "exception") -> GroupStatus:
    """A group of two, stopped, whose rank 0 failed and rank 1 was stopped."""
    failures = {0: failure(0, kind), 1: failure(1, "stopped")}
    return GroupStatus(2, frozenset({0, 1}), failures, stopped=True)


def decide(policy: FailurePolicy, status: GroupStatus) -> FailureDecision:
    decision = policy.decide(status)
    assert isinstance(decision, FailureDecision)
    return decision


def test_a_failure_within_max_failures_restarts_and_says_what_is_left() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=2))
    first, second, third = (decide(policy, ended()) for _ in range(3))
    assert (first.restart, first.count, first.budget_left) == (True, 1, 1)
    assert (second.restart, second.count, second.budget_left) == (True, 2, 0)
    assert (third.restart, third.count, third.budget_left) == (False, 3, 0)
    assert first.reason == "failure 1: rank 0 (host): RuntimeError: boom"
    assert third.error.num_restarts == 2  # the attempts before it
    assert len(policy.failures) == 3


def test_unlimited_failures_always_restart() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=-1))
    decisions = [decide(policy, ended()) for _ in range(5)]
    assert all(d.restart and d.budget_left is None for d in decisions)


def test_preemptions_use_their_own_budget_then_count_as_failures() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=1, max_preemption_failures=1))
    preempted = decide(policy, ended("preempted"))
    assert (preempted.restart, preempted.counted_as, preempted.budget_left) == (
        True,
        "preemption",
        0,
    )
    again = decide(policy, ended("preempted"))  # the budget is used: an ordinary failure
    assert (again.restart, again.counted_as, again.count) == (True, "failure", 1)
    last = decide(policy, ended())
    assert (last.restart, last.counted_as, last.count) == (False, "failure", 2)
    assert policy.preemptions == 1


KINDS = ("exception", "exit", "worker_lost", "preempted", "hang", "stopped", "fenced")


@settings(max_examples=200, deadline=None)
@given(
    attempts=st.lists(
        st.dictionaries(st.integers(0, 3), st.sampled_from(KINDS), min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    ),
    max_failures=st.integers(-1, 5),
    max_preemptions=st.integers(-1, 3),
    allowance=st.none() | st.integers(0, 5),
)
def test_a_fenced_attempt_is_never_restarted_whatever_the_budgets(
    attempts: list[dict[int, str]],
    max_failures: int,
    max_preemptions: int,
    allowance: int | None,
) -> None:
    """Generated runs of failed attempts: an attempt with a fenced rank (the driver was silent
    past DaskConfig.driver_timeout_s) ends the run; the others decide as before."""
    config = FailureConfig(max_failures=max_failures, max_preemption_failures=max_preemptions)
    policy = FailurePolicy(config)
    if allowance is not None:
        policy.allow_restarts(allowance)
    for kinds in attempts:
        failures = {rank: failure(rank, kind) for rank, kind in kinds.items()}
        status = GroupStatus(4, frozenset(range(4)), failures, stopped=True)
        decision = decide(policy, status)
        if "fenced" in kinds.values():
            assert not decision.restart
            assert decision.budget_left == 0
            return
        if not decision.restart:
            return


def test_recording_a_failure_with_no_restart_counts_it() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=3))
    error = policy.record({0: failure()})
    assert error.root_cause.summary == "RuntimeError: boom"
    assert len(policy.failures) == 1


class Grace:
    """The attempt's preemption grace, as the policy asks it: noticed ranks, and whether it
    holds for the ended ones (scripted)."""

    def __init__(self, holds: bool) -> None:
        self.noticed: set[int] = set()
        self._holds = holds
        self.asked: list[set[int]] = []

    def notice(self, ranks: set[int]) -> None:
        self.noticed |= ranks

    def holds(self, ended: set[int]) -> bool:
        self.asked.append(ended)
        return self._holds


RANKS = st.sets(st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(
    ended_ranks=RANKS,
    failed=RANKS,
    retiring=RANKS,
    grace=st.none() | st.booleans(),
    stopped=st.booleans(),
)
@example(  # the survivors ended too, before the grace did: nothing to wait for
    ended_ranks={0, 1, 2, 3}, failed={1}, retiring={1}, grace=True, stopped=False
)
def test_a_poll_waits_only_within_a_grace_and_decides_once_the_group_was_stopped(
    ended_ranks: set[int], failed: set[int], retiring: set[int], grace: bool | None, stopped: bool
) -> None:
    failed &= ended_ranks
    if stopped:
        ended_ranks = {0, 1, 2, 3}
    status = GroupStatus(
        4,
        frozenset(ended_ranks),
        {rank: failure(rank, "exit") for rank in failed},
        frozenset(retiring),
        stopped,
    )
    policy = FailurePolicy(FailureConfig(max_failures=0))
    scripted = None if grace is None else Grace(holds=grace)
    policy.start_attempt(scripted)  # type: ignore[arg-type]
    decision = policy.decide(status)
    if scripted is not None:
        assert scripted.noticed == retiring  # told of every retiring rank
    if not failed:
        assert decision is None
    elif not stopped:  # however many ended: a preempted worker's rank is named when stopped
        everyone_ended = len(ended_ranks) == 4  # nobody left to wait for
        held = scripted is not None and failed <= retiring and grace and not everyone_ended
        assert decision is (Pending.WAIT if held else Pending.STOP)
        assert policy.failures == []  # nothing counted before the group was stopped
    else:
        assert isinstance(decision, FailureDecision) and not decision.restart
        assert len(policy.failures) == 1
