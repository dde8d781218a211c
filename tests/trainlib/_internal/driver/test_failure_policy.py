"""The failure policy: restart or raise after a failed attempt, with the reason and the budget
left; preemptions counted apart while their budget lasts."""

from __future__ import annotations

from trainlib import FailureConfig, RankFailure
from trainlib._internal.driver.failure_policy import FailurePolicy


def failed(kind: str = "exception") -> dict[int, RankFailure]:
    return {0: RankFailure(0, "host", kind, "RuntimeError: boom")}  # type: ignore[arg-type]


def test_a_failure_within_max_failures_restarts_and_says_what_is_left() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=2))
    first, second, third = (policy.decide(failed()) for _ in range(3))
    assert (first.restart, first.count, first.budget_left) == (True, 1, 1)
    assert (second.restart, second.count, second.budget_left) == (True, 2, 0)
    assert (third.restart, third.count, third.budget_left) == (False, 3, 0)
    assert first.reason == "failure 1: rank 0 (host): RuntimeError: boom"
    assert third.error.num_restarts == 2  # the attempts before it
    assert len(policy.failures) == 3


def test_unlimited_failures_always_restart() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=-1))
    decisions = [policy.decide(failed()) for _ in range(5)]
    assert all(d.restart and d.budget_left is None for d in decisions)


def test_preemptions_use_their_own_budget_then_count_as_failures() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=1, max_preemption_failures=1))
    preempted = policy.decide(failed("preempted"))
    assert (preempted.restart, preempted.counted_as, preempted.budget_left) == (
        True,
        "preemption",
        0,
    )
    again = policy.decide(failed("preempted"))  # the budget is used: an ordinary failure
    assert (again.restart, again.counted_as, again.count) == (True, "failure", 1)
    last = policy.decide(failed())
    assert (last.restart, last.counted_as, last.count) == (False, "failure", 2)
    assert policy.preemptions == 1


def test_recording_a_failure_with_no_restart_counts_it() -> None:
    policy = FailurePolicy(FailureConfig(max_failures=3))
    error = policy.record(failed())
    assert error.root_cause.summary == "RuntimeError: boom"
    assert len(policy.failures) == 1
