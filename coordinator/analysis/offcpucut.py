"""Blocked time of the threads that ran a unit of work (a Spark task, a Flink subtask) for the stage and
vertex rows (``coordinator analyze --by stage|vertex``): offcpu_contexts.json's parts of the off-CPU
timeline, each stack given its task by the off-CPU rule, summed per thread context over a PID's intervals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from coordinator.analysis.inputs import PidInput
from profiler.capture import format as capture
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import read_pid_offcpu_contexts
from profiler.matching.matcher import Matcher, match_offcpu

# thread context (full thread name) -> task of the profile -> cause -> blocked nanoseconds
ContextOffCpu = dict[str, dict[str, Counter[str]]]


def context_offcpu(entries: Iterable[OffCpuEntry], matcher: Matcher) -> ContextOffCpu:
    """Blocked nanoseconds per context, task and cause of the entries that carry a context (pure)."""
    by_context: dict[str, list[OffCpuEntry]] = {}
    for entry in entries:
        if entry.context is not None:
            by_context.setdefault(entry.context, []).append(entry)
    return {context: match_offcpu(matcher, mine) for context, mine in by_context.items()}


def read_context_offcpu(capture_dir: Path, pid: PidInput, matcher: Matcher) -> ContextOffCpu | None:
    """The PID's blocked time per context over its intervals (all, or its sub-window's); None: not
    measured (no --off-cpu, or a capture made before the blocks kept their thread)."""
    if pid.offcpu is None:
        return None
    by_interval = read_pid_offcpu_contexts(capture_dir, pid.process.pid)
    if by_interval is None:
        return None
    first, last = pid.intervals if pid.intervals is not None else (0, capture.MAX_OFFCPU_INTERVAL)
    kept = (e for interval, entries in by_interval.items() if first <= interval <= last for e in entries)
    return context_offcpu(kept, matcher)


def add_offcpu(into: dict[str, Counter[str]], tasks: Mapping[str, Counter[str]]) -> None:
    """Add blocked nanoseconds per task and cause ``tasks`` into ``into``."""
    for task, causes in tasks.items():
        into.setdefault(task, Counter()).update(causes)


def task_causes(by_task: Mapping[str, Counter[str]] | None, task: str | None) -> Counter[str] | None:
    """Blocked nanoseconds per cause of ``task`` (None: every task summed); None stays None (not measured)."""
    if by_task is None:
        return None
    if task is None:
        return sum(by_task.values(), Counter())
    return by_task.get(task, Counter())
