"""The run's concerns on the controller's lifecycle (``controller_callbacks``), each driven by a
generated sequence of attempts with stand-ins for what it is handed: the user's callbacks hear
every group start and end in order, their run starts with the first group's size, a trial's
lease withholds each group's unresponsive workers, and every hook of the base is a no-op."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trainlib._internal.driver.controller_callbacks import ControllerCallback
from trainlib._internal.driver.controller_callbacks.lease_withholding import LeaseWithholding
from trainlib._internal.driver.controller_callbacks.user_callbacks import UserCallbacks
from trainlib._internal.driver.controller_state import Initializing, Scheduling
from trainlib.callbacks import Callback, GroupInfo

ATTEMPTS = st.lists(st.integers(1, 4), min_size=1, max_size=6)  # each attempt's ranks


class _Heard(Callback):
    def __init__(self, name: str, heard: list[tuple[str, str, int]]) -> None:
        self._name, self._heard = name, heard

    def on_group_start(self, group: GroupInfo) -> None:
        self._heard.append((self._name, "start", group.attempt))

    def on_group_end(self, group: GroupInfo) -> None:
        self._heard.append((self._name, "end", group.attempt))


@settings(max_examples=100, deadline=None)
@given(attempts=ATTEMPTS, listeners=st.integers(0, 3))
def test_user_callbacks_hear_every_group_in_order(attempts: list[int], listeners: int) -> None:
    heard: list[tuple[str, str, int]] = []
    started: list[int] = []
    names = [f"c{i}" for i in range(listeners)]
    concern = UserCallbacks([_Heard(n, heard) for n in names], started.append)
    for attempt, ranks in enumerate(attempts, start=1):
        concern.before_worker_group_start(None, [None] * ranks)  # type: ignore[arg-type, list-item]
        group = GroupInfo(attempt, (), None)
        concern.after_worker_group_start(group)
        concern.before_worker_group_shutdown(group)
    assert started == attempts  # the run record keeps on_start to the first
    assert heard == [
        (name, when, attempt)
        for attempt in range(1, len(attempts) + 1)
        for when in ("start", "end")
        for name in names
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sets(st.sampled_from(["tcp://a", "tcp://b", "tcp://c"])), max_size=5))
def test_a_trials_lease_withholds_each_groups_unresponsive_workers(
    groups: list[set[str]],
) -> None:
    withheld: list[set[str]] = []
    lease = SimpleNamespace(withhold=lambda addresses: withheld.append(set(addresses)))
    concern = LeaseWithholding(lease)  # type: ignore[arg-type]
    for unresponsive in groups:
        concern.after_worker_group_shutdown(SimpleNamespace(unresponsive_workers=unresponsive))  # type: ignore[arg-type]
    assert withheld == groups


def test_every_hook_of_the_base_does_nothing() -> None:
    base = ControllerCallback()
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("after_controller_start", (None,)),
        ("after_controller_state_update", (Initializing(), Scheduling(1))),
        ("before_worker_group_start", (None, [])),
        ("after_worker_group_start", (None,)),
        ("after_worker_group_failure", (None,)),
        ("before_worker_group_shutdown", (None,)),
        ("after_worker_group_shutdown", (None,)),
        ("after_run_trained", ()),
        ("before_controller_shutdown", ()),
    ]
    hooks = {name for name in vars(ControllerCallback) if not name.startswith("_")}
    assert hooks == {name for name, _ in calls}  # a new hook is listed here too
    assert [getattr(base, name)(*args) for name, args in calls] == [None] * len(calls)
