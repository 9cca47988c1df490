"""The time axis of a capture: sub-windows of the sampling window (``analyze --from/--to``) and the
per-interval series of the report's time chart. Pure: typed data in, typed data out, no I/O.

docs/capture-format.md defines the interval files (timeline.folded, counters_timeline.json);
docs/summary-format.md says how a sub-window changes summary.csv, docs/report.md the chart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from profiler.capture.format import CounterDelta, CounterValue, Overhead, PidCounters, RunMeta
from profiler.capture.offcpu import OffCpuEntry, merge_entries
from profiler.errors import ConfigError
from profiler.matching.aggregate import INSTRUCTIONS_EVENT

# Interval arithmetic tolerates float noise: 0.3 s / 0.1 s must be interval 3, not 2.
_EPSILON = 1e-9
# meta.json's start/end are wall-clock reads around the window, a few ms longer than the sampler's
# own: a 30.0006 s window of 5 s intervals has 6 intervals, not a 7th of 0.6 ms.
_TRAILING_SLIVER = 0.01  # of an interval
SHARE_DIGITS = 4  # share per interval in the report payload: 0.1234
CYCLES_DIGITS = 4  # significant digits of cycles per interval in the report payload

# How the counters of one PID were restricted to a sub-window (analysis.json "counters").
COUNTERS_WHOLE = "window totals"  # the sub-window is the whole window: counters.json as is
COUNTERS_TIMELINE = "counters timeline"  # summed over the sub-window's rows of counters_timeline.json
COUNTERS_SCALED = "scaled by sample fraction"  # no counters timeline: totals × sub-window samples / samples
COUNTERS_NONE = "not measured"  # no counters timeline and no samples to scale by (managing PIDs)


@dataclass(frozen=True)
class SubWindow:
    """``--from``/``--to``: seconds into the sampling window; None is open (start or end)."""

    start: float | None = None
    end: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("--from", self.start), ("--to", self.end)):
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ConfigError(f"{name} {value!r}: give seconds into the window, 0 or more")
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise ConfigError(f"--from {self.start:g} is not before --to {self.end:g}; give --from < --to")

    @property
    def requested(self) -> bool:
        return self.start is not None or self.end is not None

    def describe(self) -> str:
        start = f"{self.start:g}" if self.start is not None else "0"
        end = f"{self.end:g} s" if self.end is not None else "the end"
        return f"{start}–{end}"


@dataclass(frozen=True)
class IntervalSpan:
    """The whole intervals of one capture that overlap a sub-window: ``first..last`` inclusive."""

    first: int
    last: int
    interval: float  # seconds per interval
    duration: float  # seconds of the capture's window
    count: int  # intervals in the capture's window

    @property
    def start(self) -> float:
        """Seconds into the window where the first interval starts."""
        return self.first * self.interval

    @property
    def end(self) -> float:
        """Seconds into the window where the last interval ends (the window's end for a partial one)."""
        return min((self.last + 1) * self.interval, self.duration)

    @property
    def whole(self) -> bool:
        return self.first == 0 and self.last >= self.count - 1

    def contains(self, interval: int) -> bool:
        return self.first <= interval <= self.last

    def describe(self) -> str:
        return f"{self.start:g}–{self.end:g} s (intervals {self.first}–{self.last} of {self.interval:g} s)"

    def to_json(self) -> dict[str, Any]:
        return {
            "first_interval": self.first,
            "last_interval": self.last,
            "interval": self.interval,
            "from": self.start,
            "to": self.end,
            "whole_window": self.whole,
        }


def interval_count(duration: float, interval: float) -> int:
    """Intervals of a window: the last one may be partial (a sliver under 1 % of an interval is no
    interval of its own); at least one."""
    return max(1, math.ceil(duration / interval - _TRAILING_SLIVER))


def clamp_deltas(deltas: Sequence[CounterDelta], count: int) -> list[CounterDelta]:
    """Counter rows with the final reading past the last interval folded into the last interval:
    the reading at the window's end closes it (captures of the first ring-buffer runner number it
    one too high when the window's wall-clock length overshoots a whole number of intervals)."""
    out: dict[int, CounterDelta] = {}
    for delta in deltas:
        index = min(delta.interval, count - 1)
        before = out.get(index)
        if before is None:
            out[index] = replace(delta, interval=index)
        else:
            out[index] = CounterDelta(
                index,
                _add(before.cycles, delta.cycles),
                _add(before.instructions, delta.instructions),
                _add(before.cpu_seconds, delta.cpu_seconds),
            )
    return [out[index] for index in sorted(out)]


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def timeline_problem(meta: RunMeta) -> str | None:
    """Why a capture cannot be restricted to a sub-window, or None when it can."""
    if meta.format_version < 2:
        return f"format_version {meta.format_version} capture, which has no timeline"
    if meta.stack_collection != "ringbuf":
        return f"stack_collection {meta.stack_collection!r} keeps no sample timestamps, so no timeline"
    return None


def resolve_span(window: SubWindow, meta: RunMeta, where: str) -> IntervalSpan:
    """The intervals of a capture overlapping ``[start, end)``; intervals are whole, so the
    effective sub-window may be wider than the requested one. ``where`` names the capture in errors."""
    interval, duration = meta.interval, meta.duration
    if not interval > 0:
        raise ConfigError(f"{where}: interval {interval!r} in meta.json; re-run the capture")
    count = interval_count(duration, interval)
    first = math.floor(window.start / interval + _EPSILON) if window.start is not None else 0
    last = count - 1 if window.end is None else min(count - 1, math.ceil(window.end / interval - _EPSILON) - 1)
    if window.start is not None and (first > count - 1 or window.start >= duration):
        raise ConfigError(
            f"{where}: --from {window.start:g} is at or past the end of its {duration:.1f} s window; "
            "give a smaller --from"
        )
    return IntervalSpan(first, max(first, last), interval, duration, count)


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def window_counters(counters: PidCounters, deltas: Sequence[CounterDelta], span: IntervalSpan) -> PidCounters:
    """The counters of one PID over a sub-window, from its counters timeline. Only cycles,
    instructions and CPU seconds have a timeline; every other event is left out (not measured)."""
    rows = [d for d in clamp_deltas(deltas, span.count) if span.contains(d.interval)]
    cycles = _sum_known(d.cycles for d in rows)
    instructions = _sum_known(d.instructions for d in rows)
    return PidCounters(
        pid=counters.pid,
        events=_instructions_only(instructions, "sub-window, from counters_timeline.json"),
        cycles=cycles,
        cycles_estimated=counters.cycles_estimated,
        nominal_hz=counters.nominal_hz,
        cpu_seconds=_sum_known(d.cpu_seconds for d in rows),
    )


def scaled_counters(counters: PidCounters, fraction: float) -> PidCounters:
    """The window totals of one PID × ``fraction`` (its sub-window share of samples), for a PID
    without a counters timeline. Events other than cycles, instructions, CPU seconds are left out."""

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * fraction

    return PidCounters(
        pid=counters.pid,
        events=_instructions_only(scaled(counters.get(INSTRUCTIONS_EVENT)), "sub-window, scaled by sample fraction"),
        cycles=scaled(counters.cycles),
        cycles_estimated=counters.cycles_estimated,
        nominal_hz=counters.nominal_hz,
        cpu_seconds=scaled(counters.cpu_seconds),
    )


def unmeasured_counters(counters: PidCounters) -> PidCounters:
    """A PID whose sub-window counters are unknown: every value empty, never 0."""
    return PidCounters(counters.pid, _instructions_only(None, "sub-window: no counters timeline"), None, False,
                       counters.nominal_hz, None)


def _instructions_only(value: float | None, note: str) -> dict[str, CounterValue]:
    return {INSTRUCTIONS_EVENT: CounterValue(value, value is not None, note=note)}


def sample_fraction(per_interval: Mapping[int, int], span: IntervalSpan) -> float | None:
    """Share of a PID's samples that fall in the span; None when it has no samples at all."""
    total = sum(per_interval.values())
    if not total:
        return None
    return sum(count for interval, count in per_interval.items() if span.contains(interval)) / total


# ---------------------------------------------------------------- the report's time chart


@dataclass(frozen=True)
class TaskSeries:
    """One task on one host over time: samples, share of the host's samples, and cycles per interval."""

    task: str
    samples: tuple[int, ...]
    share: tuple[float | None, ...]  # None where the host has no samples in the interval
    cycles: tuple[float | None, ...]  # None where some sampled PID has no counter delta


@dataclass(frozen=True)
class HostTimeline:
    """The time chart of one host: every task with samples, in report task order."""

    host: str
    interval: float
    duration: float
    totals: tuple[int, ...]  # samples of all workload PIDs per interval
    series: tuple[TaskSeries, ...]

    @property
    def cycles_known(self) -> bool:
        return any(c is not None for s in self.series for c in s.cycles)

    def to_json(self, task_index: Mapping[str, int]) -> dict[str, Any]:
        """Compact payload: tasks as indices into the report's task list, rounded numbers."""
        return {
            "host": self.host,
            "interval": self.interval,
            "duration": round(self.duration, 3),
            "totals": list(self.totals),
            "series": [
                {
                    "task": task_index[s.task],
                    "samples": list(s.samples),
                    "share": [None if v is None else round(v, SHARE_DIGITS) for v in s.share],
                    "cycles": [None if v is None else float(f"{v:.{CYCLES_DIGITS}g}") for v in s.cycles]
                    if self.cycles_known
                    else None,
                }
                for s in self.series
            ],
        }


def host_timeline(
    host: str,
    interval: float,
    duration: float,
    per_pid: Mapping[int, Mapping[int, Mapping[str, int]]],
    deltas: Mapping[int, Sequence[CounterDelta]],
    task_names: Sequence[str],
    window_cycles: Mapping[int, float | None] | None = None,
) -> HostTimeline:
    """Per interval and task: samples summed over the host's workload PIDs, share of the host's
    samples, and cycles = Σ over PIDs of (task samples / PID samples) × the PID's cycle delta in
    that interval (the summary's rule, paper section 3.3, applied per interval). ``per_pid`` is
    decide.TaskDecider.interval_tasks of each PID, ``deltas`` the PIDs' counters timelines. A PID without a
    counters timeline gets its window cycles (``window_cycles``) × its share of its samples in the
    interval, as ``analyze --from/--to`` does; without those either, the interval's cycles are None."""
    count = interval_count(duration, interval)
    for intervals in per_pid.values():
        if intervals:
            count = max(count, max(intervals) + 1)
    totals = [0] * count
    pid_totals: dict[int, list[int]] = {}
    for pid, intervals in per_pid.items():
        row = pid_totals[pid] = [0] * count
        for index, tasks in intervals.items():
            row[index] = sum(tasks.values())
            totals[index] += row[index]
    cycles_of: dict[int, dict[int, float | None]] = {
        pid: {d.interval: d.cycles for d in clamp_deltas(rows, count)} for pid, rows in deltas.items()
    }
    for pid, total in (window_cycles or {}).items():
        pid_samples = sum(pid_totals.get(pid, ()))
        if pid not in cycles_of and total is not None and pid_samples:
            cycles_of[pid] = {i: total * n / pid_samples for i, n in enumerate(pid_totals[pid])}
    series = []
    for task in task_names:
        samples = [sum(per_pid[pid].get(i, {}).get(task, 0) for pid in per_pid) for i in range(count)]
        if not any(samples):
            continue
        cycles: list[float | None] = []
        for i in range(count):
            value: float | None = 0.0
            for pid, intervals in per_pid.items():
                pid_samples = pid_totals[pid][i]
                if not pid_samples:
                    continue
                delta = cycles_of.get(pid, {}).get(i)
                if delta is None or value is None:
                    value = None
                    continue
                value += intervals[i].get(task, 0) / pid_samples * delta
            cycles.append(value if totals[i] else None)
        share = tuple(samples[i] / totals[i] if totals[i] else None for i in range(count))
        series.append(TaskSeries(task, tuple(samples), share, tuple(cycles)))
    return HostTimeline(host, interval, duration, tuple(totals), tuple(series))


@dataclass(frozen=True)
class OverheadSeries:
    """The profiler's own RSS and CPU over the window (overhead.json ``timeline``)."""

    t: tuple[float, ...]  # seconds into the window
    rss_mib: tuple[float, ...]
    cpu_percent: tuple[float | None, ...]  # of one core, since the previous point (None at the first)

    def to_json(self) -> dict[str, Any]:
        return {
            "t": [round(v, 3) for v in self.t],
            "rssMiB": [round(v, 2) for v in self.rss_mib],
            "cpuPercent": [None if v is None else round(v, 3) for v in self.cpu_percent],
        }


def overhead_series(overhead: Overhead | None) -> OverheadSeries | None:
    """RSS in MiB and CPU in % of one core between consecutive points; None without a timeline."""
    if overhead is None or not overhead.timeline:
        return None
    points = sorted(overhead.timeline, key=lambda p: p.t)
    cpu: list[float | None] = []
    previous = None
    for point in points:
        if previous is None:
            # the first point's CPU counts from the window's start (t = 0, 0 CPU seconds)
            cpu.append(100.0 * point.cpu_seconds / point.t if point.t > 0 else None)
        else:
            span = point.t - previous.t
            cpu.append(100.0 * (point.cpu_seconds - previous.cpu_seconds) / span if span > 0 else None)
        previous = point
    return OverheadSeries(
        tuple(p.t for p in points), tuple(p.rss_bytes / 2**20 for p in points), tuple(cpu)
    )


def window_offcpu(by_interval: Mapping[int, Sequence[OffCpuEntry]], span: IntervalSpan) -> tuple[OffCpuEntry, ...]:
    """Blocked time of the span (pids/<pid>/offcpu_timeline.folded): the entries of its intervals, merged
    per (cause, stack). Entries past the capture's last interval belong to it (the window's end)."""
    last_of_capture = span.count - 1
    return tuple(merge_entries(
        entry
        for interval, entries in by_interval.items()
        if span.first <= min(interval, last_of_capture) <= span.last
        for entry in entries
    ))
