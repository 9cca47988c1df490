"""The agent's own CPU in the window by component: each of its threads' CPU time (/proc/self/task/TID/stat),
read at the window's start, at every poll and at its end, summed by what the thread does (its name).

A thread that ends between two readings keeps its last one: what it did after it (at most a poll, 0.5 s)
is in no component, and neither is a thread of no known name; the rest of the process's CPU is ``other``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..capture.format import ComponentCpu
from ..files import procstat

# thread name (prefix) -> component; the runner's own thread is split further by the window (scope,
# name batches, checkpoints) and what is left of it is "window"
THREAD_COMPONENTS: tuple[tuple[str, str], ...] = (
    ("ringbuf-reader", "reading"),
    ("prepare-", "preparation"),
    ("target-preparation", "preparation"),
    ("cfi-loader", "preparation"),
    ("symbol-prep", "naming"),
    ("thread-names", "naming"),
    ("map-file-", "naming"),
    ("event-counter", "engines"),
    ("flink-metrics", "engines"),
    ("spark-plans", "engines"),
    ("offcpu-java-threads", "off-cpu"),
    ("MainThread", "window"),
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def component_of(thread_name: str) -> str:
    return next((component for prefix, component in THREAD_COMPONENTS if thread_name.startswith(prefix)), "other")


def thread_cpu_seconds(tid: int) -> float | None:
    """User + system CPU seconds of this process's thread ``tid`` (10 ms ticks); None once it is gone."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as handle:
            line = procstat.split_stat(handle.read(1024))
    except OSError:
        return None
    if line is None:
        return None
    user, system = line.count(procstat.UTIME), line.count(procstat.STIME)
    if user is None or system is None:
        return None
    return (user + system) / CLOCK_TICKS


@dataclass
class _Seen:
    component: str
    first: float  # its CPU when first read (0 for a thread born after the window's start)
    last: float


class ThreadCpu:
    """Each thread's CPU from ``begin()`` on, by component. ``read`` and ``threads`` are injectable for tests."""

    def __init__(
        self,
        read: Callable[[int], float | None] = thread_cpu_seconds,
        threads: Callable[[], Iterable[threading.Thread]] = threading.enumerate,
    ) -> None:
        self._read = read
        self._threads = threads
        self._seen: dict[tuple[int, str], _Seen] = {}
        self._begun = False

    def begin(self) -> None:
        """The window starts: every live thread's CPU so far is not the window's."""
        self._begun = False
        self._seen.clear()
        self.sample()
        self._begun = True

    def sample(self) -> None:
        """Read every live thread (each poll: a few reads of our own /proc files)."""
        for thread in self._threads():
            tid = thread.native_id
            if tid is None:
                continue
            cpu = self._read(tid)
            if cpu is None:
                continue
            key = (tid, thread.name)
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = _Seen(component_of(thread.name), cpu if not self._begun else 0.0, cpu)
            else:
                seen.last = max(seen.last, cpu)

    def by_component(self) -> dict[str, float]:
        """CPU seconds since begin() per component, as last read."""
        totals: dict[str, float] = {}
        for seen in self._seen.values():
            totals[seen.component] = totals.get(seen.component, 0.0) + max(0.0, seen.last - seen.first)
        return totals


def split_components(
    threads: Mapping[str, float], total: float, runner_parts: Mapping[str, float]
) -> tuple[ComponentCpu, ...]:
    """The window's CPU by component: the threads' sums, the runner's thread split into ``runner_parts``
    (scope, naming, checkpoint: measured in it) and "window" (what is left of it), and "other": ``total`` (the
    process's CPU) less all of those (threads that ended between readings, threads of no known name)."""
    found = dict(threads)
    window = found.pop("window", 0.0)
    for part, seconds in runner_parts.items():
        found[part] = found.get(part, 0.0) + seconds
    found["window"] = max(0.0, window - sum(runner_parts.values()))
    found["other"] = found.get("other", 0.0) + max(0.0, total - sum(found.values()))
    return tuple(ComponentCpu(name, round(seconds, 3)) for name, seconds in sorted(found.items()) if seconds > 0)
