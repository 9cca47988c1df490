"""What a demo adds to each host's events.json beside the profiler's count (the query's own count where it is
closer, the records produced into Kafka over the same span, YSB's latency per window) and the clauses of the
demo's line that say them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.remote.session import ProfileOutcome
    from coordinator.workloads.ysb.engines import SourceCount, WindowResult
    from coordinator.workloads.ysb.latency import WindowLatency
    from profiler.capture.format import EventCount


def _rewrite_events(outcome: ProfileOutcome, change: Callable[[EventCount], EventCount | None]) -> list[Path]:
    """Each host's events.json replaced by ``change`` of it (None: left as it is). Returns the files written."""
    from coordinator.rundir import host_capture_dir
    from profiler.capture.format import write_events
    from profiler.capture.read import read_events

    written = []
    for host in outcome.info.hosts:
        capture = host_capture_dir(outcome.run_dir, host.host)
        current = read_events(capture) if capture.is_dir() else None
        changed = change(current) if current is not None else None
        if changed is not None:
            write_events(capture, changed)
            written.append(capture / "events.json")
    return written


def _closer(counted: EventCount, current: EventCount) -> bool:
    """Whether the query's own count replaces the profiler's: the profiler has none, or the query's
    states a smaller uncertainty (Spark Real-time Mode: the REST count is off by a 5 s batch)."""
    if current.count is None:
        return True
    return counted.uncertainty is not None and current.uncertainty is not None and (
        counted.uncertainty < current.uncertainty
    )


def fill_event_counts(outcome: ProfileOutcome, counted: EventCount | None) -> list[Path]:
    """Where the profiler could not count the window's events from the engine (Spark Continuous
    Processing runs no micro-batches for the REST count), or counted them less exactly than the query
    itself (a smaller stated uncertainty), write the count the query itself gives; the profiler's
    count stays in the detail (coordinator demo --hosts: the driver is on none of the hosts, so no agent
    counts). Returns the events.json files written."""
    from profiler.capture.format import EventCount

    def change(current: EventCount) -> EventCount | None:
        if counted is None or not _closer(counted, current):
            return None
        own = f"{current.count} ± {current.uncertainty or 0:.0f}, " if current.count is not None else ""
        detail = f"{counted.detail}; the profiler's own count: {own}{current.detail}"
        return EventCount(
            counted.count, counted.source, detail, current.window_start, current.window_end, counted.method,
            counted.uncertainty,
        )

    return _rewrite_events(outcome, change)


def sampling_window(outcome: ProfileOutcome, duration: float) -> tuple[float, float]:
    """The window the host sampled (shorter when Ctrl-C stopped it early): the demo's one local host
    says when it began and ended; the run's planned start can be tens of seconds earlier when the
    host agent was slow to attach (a loaded machine). Without a host's times, the run's."""
    hosts = [h for h in outcome.info.hosts if h.start_time is not None and h.end_time is not None]
    if hosts:
        return max(h.start_time for h in hosts if h.start_time), min(h.end_time for h in hosts if h.end_time)
    started = outcome.info.start_time or 0.0
    return started, min(outcome.info.end_time or started + duration, started + duration)


def record_produced(outcome: ProfileOutcome, window: WindowResult) -> list[Path]:
    """Reading Kafka: the records produced over a span of the window and the records the engine read
    over the same span by its own count, beside the profiler's count in each host's events.json
    (``produced``, ``produced_read``, ``produced_detail``). Returns the files written."""
    produced = window.produced
    if produced is None:
        return []
    return _rewrite_events(outcome, lambda current: replace(
        current, produced=produced.records, produced_read=window.events, produced_detail=produced.detail,
    ))


def record_latency(outcome: ProfileOutcome, window: WindowResult) -> list[Path]:
    """YSB's latency per window (WindowResult.latency) into each host's events.json (``latency_*``), beside
    its events. Returns the files written."""
    latency = window.latency
    if latency is None:
        return []
    return _rewrite_events(outcome, lambda current: replace(
        current, latency_windows=latency.windows, latency_median_ms=latency.median_ms,
        latency_p95_ms=latency.p95_ms, latency_max_ms=latency.max_ms, latency_min_ms=latency.min_ms,
        latency_detail=latency.detail,
    ))


def latency_clause(latency: WindowLatency | None) -> str:
    """``; latency per 10 s window median 2.41 s, p95 4.80 s, max 5.02 s (min 0.31 s, 200 windows)`` ('' without)."""
    if latency is None:
        return ""
    return (
        f"; latency per 10 s window median {latency.median_ms / 1000:.2f} s, p95 {latency.p95_ms / 1000:.2f} s, "
        f"max {latency.max_ms / 1000:.2f} s (min {latency.min_ms / 1000:.2f} s, {latency.windows} windows)"
    )


def produced_clause(events: int | None, produced: SourceCount | None) -> str:
    """``; 299955 records produced into Kafka over the same span (+0.2 %)`` ('' without Kafka)."""
    if produced is None:
        return ""
    share = f" ({100.0 * (events - produced.records) / produced.records:+.1f} %)" if events and produced.records else ""
    return f"; {produced.records} records produced into Kafka over the same span{share}"
