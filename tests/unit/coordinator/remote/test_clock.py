"""The run's clock: the system's waits as they are, and the virtual one test_session.py runs on (time stands
still while a thread of the run works, and jumps once every one waits)."""

from __future__ import annotations

import threading
import time

import pytest

from coordinator.remote.clock import SYSTEM_CLOCK
from tests.fixtures.virtual_clock import ThreadedVirtualClock, VirtualDeadlock


def test_the_system_clock_waits_as_threading_does() -> None:
    event = threading.Event()
    began = SYSTEM_CLOCK.monotonic()
    assert SYSTEM_CLOCK.wait(event, 0.01) is False
    assert SYSTEM_CLOCK.monotonic() - began >= 0.01
    event.set()
    assert SYSTEM_CLOCK.wait(event) is True
    assert abs(SYSTEM_CLOCK.time() - time.time()) < 1.0


def test_virtual_time_jumps_to_the_earliest_wake_up_once_every_thread_waits() -> None:
    # GIVEN a member thread that sleeps 5 virtual seconds, then sets an event
    clock = ThreadedVirtualClock()
    began, wall = clock.monotonic(), clock.time()
    done = threading.Event()
    woke: list[float] = []

    def member() -> None:
        clock.sleep(5.0)
        woke.append(clock.monotonic() - began)
        done.set()

    thread = threading.Thread(target=member, name="host-a")
    thread.start()
    # WHEN the test's thread sleeps 2 s, then waits up to 10 s for the event
    clock.sleep(2.0)
    at_two = clock.monotonic() - began
    assert clock.wait(done, 10.0) is True
    thread.join()
    # THEN each woke at its own virtual time, and the wall clock moved as much
    assert at_two == 2.0 and woke == [5.0]
    assert clock.monotonic() - began == 5.0 and clock.time() - wall == 5.0


def test_a_working_member_holds_virtual_time_still() -> None:
    # GIVEN a member that works 50 real ms (no wait on the clock) before it waits
    clock = ThreadedVirtualClock()
    began = clock.monotonic()
    worked = threading.Event()

    def member() -> None:
        time.sleep(0.05)  # real work: the virtual clock must not move meanwhile
        worked.set()
        clock.sleep(0.5)

    thread = threading.Thread(target=member, name="host-b")
    thread.start()
    # WHEN the test's thread sleeps 0.1 virtual s; THEN it wakes only after the member's work
    clock.sleep(0.1)
    assert worked.is_set() and clock.monotonic() - began == pytest.approx(0.1)
    clock.join(thread)
    assert clock.monotonic() - began == pytest.approx(0.5)


def test_timers_run_at_their_virtual_time_and_hangs_raise() -> None:
    clock = ThreadedVirtualClock()
    began = clock.monotonic()
    fired = threading.Event()
    clock.after(3.0, fired.set)
    assert clock.wait(fired) is True and clock.monotonic() - began == 3.0
    with pytest.raises(VirtualDeadlock, match="waits forever"):
        clock.wait(threading.Event())
    # a busy wait for a deadline would spin for ever in virtual time: it raises instead
    with pytest.raises(VirtualDeadlock, match="without waiting"):
        while clock.monotonic() < began + 10:
            clock.wait(fired, 1.0)  # already set: returns at once
