"""InterruptWatch: Ctrl-C is recorded while a run is in flight and raised at a safe point."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from trainlib._internal.driver.interrupt import InterruptWatch


def test_interrupt_first_ctrl_c_is_recorded_not_raised() -> None:
    with pytest.raises(KeyboardInterrupt), InterruptWatch():
        os.kill(os.getpid(), signal.SIGINT)  # handled before kill() returns
        assert InterruptWatch.requested()
        InterruptWatch.check()
    assert not InterruptWatch.requested()


def test_interrupt_second_ctrl_c_raises_at_once() -> None:
    with pytest.raises(KeyboardInterrupt), InterruptWatch():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        pytest.fail("the second Ctrl-C did not raise")


def test_interrupt_recorded_during_a_finishing_run_is_raised_on_exit() -> None:
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest runs as a background job
    with pytest.raises(KeyboardInterrupt), InterruptWatch():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_interrupt_watch_restores_the_previous_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    with InterruptWatch():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before


def test_interrupt_watch_outside_the_main_thread_changes_nothing() -> None:
    seen: list[object] = []

    def in_thread() -> None:
        with InterruptWatch():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen == [before]
