"""A flow's time limit: it names itself, stops a training at a safe point, and lets a real
Ctrl-C through as it is."""

from __future__ import annotations

import signal
import time

import pytest

from flows.time_limit import TimeLimitExceeded, time_limit
from trainlib._internal.driver.interrupt import InterruptWatch

LIMIT_MIN = 0.005  # 0.3 s
WAIT_S = 10.0


def test_time_limit_stops_plain_code_where_it_is_and_names_the_limit() -> None:
    started = time.monotonic()
    with (
        pytest.raises(TimeLimitExceeded, match=r"demo ran longer .* timeout_minutes=0\.005"),
        time_limit(LIMIT_MIN, "demo"),
    ):
        while time.monotonic() - started < WAIT_S:
            time.sleep(0.01)
    assert time.monotonic() - started < WAIT_S / 2


def test_time_limit_stops_a_training_in_flight_at_its_next_safe_point() -> None:
    # while a run defers Ctrl-C (trainlib's InterruptWatch), the limit takes that path: the
    # steps between two checks are never cut short
    finished_steps = 0
    with pytest.raises(TimeLimitExceeded), time_limit(LIMIT_MIN, "demo"), InterruptWatch():
        started = time.monotonic()
        while time.monotonic() - started < WAIT_S:
            step_started = time.monotonic()
            while time.monotonic() - step_started < 0.1:  # a step: no check inside it
                pass
            finished_steps += 1
            InterruptWatch.check()
    assert 1 <= finished_steps < WAIT_S / 0.1 / 2


def test_time_limit_lets_a_real_ctrl_c_through_and_puts_an_enclosing_alarm_back() -> None:
    enclosing = signal.getsignal(signal.SIGALRM)  # pytest-timeout's, when it uses signals
    outer = signal.setitimer(signal.ITIMER_REAL, 600.0)
    # Python's own Ctrl-C, whatever an earlier test of the session left installed (in one
    # fresh-clone run, SIGINT did not raise here: found, not yet explained)
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), time_limit(1.0, "demo"):
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGALRM) is enclosing
        assert 590 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGINT, sigint)
