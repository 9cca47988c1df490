"""The capture directory written from what a run collected (one ``Collected`` value): scope, stack tables,
counters and their timelines, network bytes, off-CPU time, events, the host's result rows, meta.json and
overhead.json.

The writer never reads a component nor imports the runner: the runner builds ``Collected`` from its
components when the window ends, ``profiler recover`` from a killed run's checkpoint journal.
"""

from __future__ import annotations

import math
import platform
import resource
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..capture import format as capture
from ..capture.format import (
    EventCount,
    FlinkSubtask,
    FlinkTaskManager,
    NetStats,
    Overhead,
    PidCounters,
    ProcessInfo,
    RunMeta,
    VertexWindow,
)
from ..capture.offcpu import OffCpuEntry
from ..capture.stackstore import CollectedStacks
from ..capture.stacktable import write_table
from ..capture.timeline import CounterReading, counter_deltas
from ..files import atomic
from ..files.textinput import TEXT_ENCODING
from ..matching.aggregate import aggregate_host
from ..matching.appprofile import ApplicationProfile
from ..matching.matcher import Matcher, MatchResult, match_offcpu, match_table, unmatched_folded_lines
from .options import RunOptions


@dataclass(frozen=True)
class Collected:
    """Everything one run collected, read once before anything is written: the window's facts, the
    sampler's, and what each component held at the end (or the journal's last checkpoint, recovered)."""

    # the window
    start_time: float
    end_time: float
    stopped_by: str  # "duration", "signal", "error" or "recovered"
    window_started: bool  # False: the run ended before its window (no timeline)
    exec_watch: str  # "tracepoint" or "polling"
    net_mode: str | None
    # the sampler's facts, known once it started
    stack_collection: str
    stack_walk: str
    max_stack_depth: int
    thread_names: str
    cycles_source: str
    # what the components held
    processes: Sequence[ProcessInfo]
    counters: Mapping[int, PidCounters]
    counter_readings: Mapping[int, Sequence[CounterReading]] = field(default_factory=dict)
    stacks: Mapping[int, CollectedStacks] = field(default_factory=dict)
    net: Mapping[int, NetStats] = field(default_factory=dict)
    offcpu: Mapping[int, Sequence[OffCpuEntry]] = field(default_factory=dict)
    # interval -> PID -> entries; None: the time is not split by interval (a recovered run): no
    # offcpu_timeline.folded is written
    offcpu_intervals: Mapping[int, Mapping[int, Sequence[OffCpuEntry]]] | None = field(default_factory=dict)
    events: EventCount | None = None
    spark_plans: Mapping[str, Any] | None = None
    flink_vertices: Sequence[VertexWindow] = ()
    flink_subtasks: Sequence[FlinkSubtask] = ()
    flink_taskmanagers: Sequence[FlinkTaskManager] = ()
    warnings: Sequence[str] = ()  # end-of-run warnings so far, each naming the option to change
    cost: Overhead = Overhead()  # the profiler's own cost during the window (the post-run figures are the writer's)
    post_start: tuple[float, float] = (0.0, 0.0)  # monotonic and process CPU time when the post-run began


def last_interval_of(elapsed: float, interval: float) -> int:
    """Index of the interval that holds the moment ``elapsed`` seconds into the window (its end belongs to it)."""
    return max(0, math.ceil(elapsed / interval) - 1)


def last_interval(options: RunOptions, start_time: float, end_time: float) -> int:
    """The window's last timeline interval. The loop ends a hair after the deadline: that sliver (the
    window is never longer than --duration) belongs to the last whole interval."""
    return last_interval_of(min(end_time - start_time, options.duration), options.interval)


def write_capture(options: RunOptions, collected: Collected, profile: ApplicationProfile) -> RunMeta:
    """Write the capture directory ``options.out`` of ``collected``; returns the meta.json written."""
    out = options.out
    warnings = list(collected.warnings)
    capture.write_scope(out, list(collected.processes))
    profile_text = Path(options.profile).read_text(encoding=TEXT_ENCODING)
    atomic.atomic_write_text(out / capture.PROFILE_COPY, profile_text)
    matcher = Matcher(profile)
    matched = write_stacks(options, collected, matcher)
    write_counters(options, collected)
    for pid_net in collected.net.values():
        capture.write_net(out, pid_net)
    for pid, entries in collected.offcpu.items():
        capture.write_offcpu(out, pid, list(entries))
        if collected.offcpu_intervals is None:
            continue  # not split: a timeline of no interval would say no time fell in any
        intervals = {i: list(by_pid.get(pid, [])) for i, by_pid in collected.offcpu_intervals.items()}
        capture.write_offcpu_timeline(out, pid, intervals)
    events = collected.events
    if events is not None:
        capture.write_events(out, replace(events, window_start=collected.start_time, window_end=collected.end_time))
    if collected.flink_vertices:
        capture.write_flink_vertices(
            out, list(collected.flink_vertices), list(collected.flink_subtasks), list(collected.flink_taskmanagers)
        )
    write_results(options, collected, matched, matcher)
    plans = collected.spark_plans
    if plans is not None:
        capture.write_spark_plans(out, dict(plans))
        warnings.extend(
            f"Spark REST API: {note}; stage rows keep stage ids only, codegen stages are not named"
            for note in plans.get("notes", [])[:3]
            if not plans.get("plans")
        )
    meta = run_meta(options, collected, warnings)
    capture.write_meta(out, meta)
    write_overhead(options, collected)
    return meta


def write_stacks(options: RunOptions, collected: Collected, matcher: Matcher) -> dict[int, MatchResult]:
    """Each PID's stack table and sampler statistics; returns each PID's match."""
    out = options.out
    matched = {}
    for pid, stacks in collected.stacks.items():
        table = stacks.table
        if table.timeline:
            table = table.clamped(last_interval(options, collected.start_time, collected.end_time))
        write_table(capture.table_path(out, pid), table, atomic.atomic_write_chunks)
        capture.write_sampler_stats(out, stacks.stats)
        matched[pid] = match_table(matcher, table)
    return matched


def write_results(
    options: RunOptions, collected: Collected, matched: Mapping[int, MatchResult], matcher: Matcher
) -> None:
    """The host's pre-aggregated result rows and its unmatched stacks (Algorithm 1, lines 22-24)."""
    out = options.out
    sampled = [p for p in collected.processes if p.pid in matched or not p.sampled]
    offcpu = {pid: match_offcpu(matcher, list(entries)) for pid, entries in collected.offcpu.items()}
    rows = aggregate_host(options.host, sampled, matched, dict(collected.counters), dict(collected.net), offcpu)
    atomic.atomic_write_text(out / capture.result_file_name(options.host), capture.format_result_csv(rows))
    unmatched = unmatched_folded_lines(matched.values())
    atomic.atomic_write_lines(out / capture.unmatched_file_name(options.host), unmatched)


def write_counters(options: RunOptions, collected: Collected) -> None:
    """counters.json per PID, and its per-interval deltas (the final reading closes the last interval)."""
    out, interval = options.out, options.interval
    start, end = collected.start_time, collected.end_time
    exited_at = {p.pid: p.last_seen for p in collected.processes if p.exited}
    last = last_interval(options, start, end)
    for pid, pid_counters in collected.counters.items():
        capture.write_counters(out, pid_counters)
        if not collected.window_started:
            continue
        ended = min(exited_at.get(pid, end), end)
        final = CounterReading.of(min(last_interval_of(ended - start, interval), last), pid_counters)
        readings = [r for r in collected.counter_readings.get(pid, []) if r.interval <= final.interval]
        capture.write_counters_timeline(out, pid, interval, counter_deltas([*readings, final]))


def run_meta(options: RunOptions, collected: Collected, warnings: Sequence[str]) -> RunMeta:
    intervals = last_interval(options, collected.start_time, collected.end_time) + 1
    return RunMeta(
        host=options.host,
        hostname=socket.gethostname(),
        kernel=platform.release(),
        profiler_version=__version__,
        frequency=options.frequency,
        duration_requested=options.duration,
        start_time=collected.start_time,
        end_time=collected.end_time,
        stopped_by=collected.stopped_by,
        cycles_source=collected.cycles_source,
        exec_watch=collected.exec_watch,
        net=collected.net_mode,
        max_stack_depth=collected.max_stack_depth,
        stack_storage_size=options.stack_storage_size,
        profile_name=Path(options.profile).name,
        warnings=tuple(dict.fromkeys(warnings)),
        stack_collection=collected.stack_collection,
        stack_walk=collected.stack_walk,
        interval=options.interval,
        intervals=intervals if collected.window_started else 0,
        perf_map_refresh=options.perf_map_refresh,
        thread_names=collected.thread_names,
        off_cpu_min_block_ms=options.off_cpu_min_block_ms if options.off_cpu else None,
        off_cpu_sample_every=options.off_cpu_sample_every if options.off_cpu else None,
    )


def peak_rss_bytes() -> int:
    """The agent's peak resident memory: VmHWM of its own image. ``ru_maxrss`` is no measure of it: Linux
    keeps the high-water mark of the image before ``execve``, and a child forked from a large parent starts
    with the parent's resident pages (under a pytest of 360 MB, every run reported 362 MB)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_overhead(options: RunOptions, collected: Collected) -> None:
    """The profiler's own cost: the window's (CPU, BPF run time, memory) and the wall and CPU time the
    post-run took since ``collected.post_start``."""
    began, cpu_began = collected.post_start
    capture.write_overhead(
        options.out,
        replace(
            collected.cost,
            post_run_seconds=round(time.monotonic() - began, 3),
            post_run_cpu_seconds=round(time.process_time() - cpu_began, 3),
            peak_rss_bytes=peak_rss_bytes(),
        ),
    )
