"""Per-interval counter deltas and the profiler's own footprint over the window (pure, no I/O).

The runner reads each process's counters at every interval boundary (cumulative values since the
process entered the scope) and once more at the end; the deltas per interval are what
counters_timeline.json stores, so a sub-window can be given its own cycles, not a share of the total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .format import CounterDelta, PidCounters


@dataclass(frozen=True)
class CounterReading:
    interval: int  # the reading closes this interval (the last one may be partial)
    cycles: float | None
    instructions: float | None
    cpu_seconds: float | None

    @classmethod
    def of(cls, interval: int, counters: PidCounters) -> CounterReading:
        return cls(interval, counters.cycles, counters.get("instructions"), counters.cpu_seconds)


def _delta(now: float | None, before: float | None) -> float | None:
    if now is None:
        return None
    return max(0.0, now - (before or 0.0))


def counter_deltas(readings: Sequence[CounterReading]) -> list[CounterDelta]:
    """Deltas between consecutive cumulative readings; the first counts from zero (the process's entry).

    Several readings closing the same interval keep the last; a value that goes missing stays None.
    """
    latest: dict[int, CounterReading] = {}
    for reading in readings:
        latest[reading.interval] = reading
    rows: list[CounterDelta] = []
    previous: CounterReading | None = None
    for interval in sorted(latest):
        reading = latest[interval]
        rows.append(
            CounterDelta(
                interval=interval,
                cycles=_delta(reading.cycles, previous.cycles if previous else None),
                instructions=_delta(reading.instructions, previous.instructions if previous else None),
                cpu_seconds=_delta(reading.cpu_seconds, previous.cpu_seconds if previous else None),
            )
        )
        previous = reading
    return rows


def rss_bytes(status_text: str) -> int:
    """VmRSS of a /proc/PID/status text, in bytes (0 when absent)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
