from __future__ import annotations

from trainlib._internal.driver.ranks import assign_ranks
from trainlib._internal.driver.watchdog import ProgressWatchdog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watchdog(timeout_s: float | None) -> tuple[ProgressWatchdog, _Clock]:
    clock = _Clock()
    slots = assign_ranks([("h1", "tcp://h1:1"), ("h2", "tcp://h2:1")])
    watchdog = ProgressWatchdog(timeout_s, slots, clock)
    for rank in (0, 1):
        watchdog.on_started(rank)
    return watchdog, clock


def test_watchdog_names_the_rank_that_fell_behind() -> None:
    watchdog, clock = _watchdog(5.0)
    for rank in (0, 1):
        watchdog.on_report(rank, 0)
    watchdog.on_complete()
    watchdog.on_report(0, 1)
    clock.now += 5.0
    assert watchdog.check() == {}
    clock.now += 0.5
    hung = watchdog.check()
    assert list(hung) == [1]
    assert hung[1].kind == "hang" and hung[1].host == "h2"
    assert hung[1].summary == (
        "made no progress for 6 s (hang_timeout_s=5); its last report was #0"
    )


def test_watchdog_names_every_rank_when_none_reported() -> None:
    watchdog, clock = _watchdog(2.0)
    clock.now += 3.0
    failures = watchdog.check()
    assert sorted(failures) == [0, 1]
    assert failures[0].summary.endswith("its last report was none in this attempt")


def test_watchdog_automatic_timeout_follows_report_intervals() -> None:
    watchdog, clock = _watchdog(None)
    clock.now += 1000.0
    assert watchdog.timeout_s is None and watchdog.check() == {}
    watchdog.on_complete()  # an interval of 1000 s
    assert watchdog.timeout_s == 5000.0
    clock.now += 4999.0
    assert watchdog.check() == {}
    clock.now += 2.0
    assert sorted(watchdog.check()) == [0, 1]


def test_watchdog_automatic_timeout_has_a_floor() -> None:
    watchdog, clock = _watchdog(None)
    clock.now += 1.0
    watchdog.on_complete()
    assert watchdog.timeout_s == 60.0


def test_watchdog_clock_starts_when_every_rank_has_started() -> None:
    clock = _Clock()
    slots = assign_ranks([("h1", "tcp://h1:1"), ("h2", "tcp://h2:1")])
    watchdog = ProgressWatchdog(2.0, slots, clock)
    watchdog.on_started(0)
    clock.now += 10.0  # slow start-up: the process group's timeout covers it
    assert watchdog.check() == {}
    watchdog.on_started(1)
    clock.now += 1.0
    assert watchdog.check() == {}
    clock.now += 1.5
    assert sorted(watchdog.check()) == [0, 1]
