"""The clock a profile run reads and waits on: the system's in use; a test's may move in virtual seconds
(tests/fixtures/virtual_clock.py), so the orchestration's windows, timeouts and retries run in milliseconds.

Every time the session and its host workers read (wall clock, monotonic) and every wait they make (a sleep,
an event with a timeout) goes through one ``Clock``, so a test clock sees each thread of the run wait.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "SYSTEM_CLOCK", "SystemClock"]


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch: the coordinator clock that start times and run.json are written in."""
        ...

    def monotonic(self) -> float:
        """Seconds of a clock that never goes back: deadlines."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, timeout: float | None = None) -> bool:
        """As ``event.wait(timeout)``: True once the event is set, False when the timeout passed first."""
        ...


class SystemClock:
    """The machine's clocks and the threading waits, as they are."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None = None) -> bool:
        return event.wait(timeout)


SYSTEM_CLOCK: Clock = SystemClock()
