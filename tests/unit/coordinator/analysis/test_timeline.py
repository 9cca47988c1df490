"""The time axis, pure: sub-window → intervals, counters over a sub-window, the time chart's series
(same Matcher as the summary) and the profiler's own footprint over time; and the report built
from a capture with a timeline."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.analysis import timeline
from coordinator.analysis.decide import TaskDecider
from coordinator.analysis.load import load_run, load_timeline
from coordinator.analysis.timeline import IntervalSpan, SubWindow
from coordinator.report.render import render_report
from coordinator.report.view import build_view
from profiler.capture import format as capture
from profiler.capture.format import CounterDelta, Overhead, OverheadPoint, PidCounters, RunMeta
from profiler.capture.read import read_capture
from profiler.capture.stacktable import table_from_folded, write_table
from profiler.errors import ConfigError
from profiler.files import atomic
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher
from tests.fixtures.captures import (
    KAFKA_STACK,
    KNOWN_PROFILE,
    OTHER_STACK,
    TIMELINE_OPTIONS,
    TIMELINE_PID_100,
    timeline_hosts,
    write_run_dir,
)
from tests.fixtures.report import make_run_dir, read_payload

META = RunMeta(
    host="h", hostname="h", kernel="6.18", profiler_version="0", frequency=99, duration_requested=95,
    start_time=1000.0, end_time=1095.0, stopped_by="duration", cycles_source="hardware", exec_watch="tracepoint",
    stack_collection="ringbuf", interval=10.0,
)


@pytest.mark.parametrize(
    ("start", "end", "first", "last", "effective"),
    [
        (None, None, 0, 9, (0, 95)),  # the last interval is partial
        (10, 20, 1, 1, (10, 20)),
        (12, 25, 1, 2, (10, 30)),  # whole intervals overlapping [12, 25)
        (0.3, 0.4, 0, 0, (0, 10)),
        (90, 500, 9, 9, (90, 95)),  # --to beyond the window: up to its end
        (None, 0.5, 0, 0, (0, 10)),
    ],
)
def test_sub_window_to_intervals(
    start: float | None, end: float | None, first: int, last: int, effective: tuple[float, float]
) -> None:
    span = timeline.resolve_span(SubWindow(start, end), META, "cap")
    assert (span.first, span.last, span.count) == (first, last, 10)
    assert (span.start, span.end) == effective
    assert span.whole == (first == 0 and last == 9)


def test_float_noise_does_not_move_an_interval_edge() -> None:
    meta = replace(META, interval=0.1, start_time=0.0, end_time=1.0)
    span = timeline.resolve_span(SubWindow(0.3, 0.6), meta, "cap")
    assert (span.first, span.last) == (3, 5)


def test_sub_window_errors() -> None:
    with pytest.raises(ConfigError, match="--from 20 is not before --to 20"):
        SubWindow(20, 20)
    with pytest.raises(ConfigError, match="0 or more"):
        SubWindow(-1, None)
    with pytest.raises(ConfigError, match=r"cap: --from 95 is at or past the end of its 95.0 s window"):
        timeline.resolve_span(SubWindow(95, None), META, "cap")
    assert timeline.timeline_problem(META) is None
    assert "format_version 1" in str(timeline.timeline_problem(replace(META, format_version=1)))
    assert "stackmap" in str(timeline.timeline_problem(replace(META, stack_collection="stackmap")))


def test_counters_over_a_sub_window() -> None:
    counters = PidCounters(7, {}, cycles=6.1e9, cycles_estimated=True, nominal_hz=2e9, cpu_seconds=3.05)
    deltas = [CounterDelta(0, 1e9, None, 0.5), CounterDelta(1, 2e9, None, 1.0), CounterDelta(2, None, None, 1.5)]
    span = IntervalSpan(1, 2, 10.0, 30.0, 3)
    restricted = timeline.window_counters(counters, deltas, span)
    assert (restricted.cycles, restricted.cpu_seconds, restricted.cycles_estimated) == (2e9, 2.5, True)
    assert restricted.get("instructions") is None  # never measured: stays empty, never 0
    scaled = timeline.scaled_counters(counters, 0.25)
    assert (scaled.cycles, scaled.cpu_seconds) == (pytest.approx(1.525e9), pytest.approx(0.7625))
    assert timeline.sample_fraction({0: 10, 1: 30, 2: 60}, span) == 0.9
    assert timeline.sample_fraction({}, span) is None


def test_time_series_use_the_summary_matcher_and_counter_deltas(tmp_path: Path) -> None:
    decider = TaskDecider(Matcher(parse_profile(KNOWN_PROFILE)))
    entries = {(i, stack): n for i, part in (TIMELINE_PID_100.timeline or {}).items() for stack, n in part.items()}
    (tmp_path / "timeline.folded").write_text(capture.format_timeline(entries))
    per_pid = {100: decider.interval_tasks(tmp_path / "timeline.folded")}
    assert per_pid[100][0] == {"Kafka": 50, "GC": 10}
    # the same samples as a stack table give the same series
    by_stack = Counter({stack: n for (_i, stack), n in entries.items()})
    write_table(tmp_path / "stacks.tpc", table_from_folded(by_stack, Counter(entries)), atomic.atomic_write_chunks)
    assert decider.interval_tasks(tmp_path / "stacks.tpc") == per_pid[100]
    # PID 200: no counters timeline, 2e9 window cycles over its 40 samples
    (tmp_path / "200.folded").write_text(capture.format_timeline({(1, KAFKA_STACK): 30, (2, OTHER_STACK): 10}))
    per_pid[200] = decider.interval_tasks(tmp_path / "200.folded")
    chart = timeline.host_timeline(
        "h1", 10.0, 30.0, per_pid, {100: TIMELINE_PID_100.counters_timeline or ()},
        ("Kafka", "Deserialize", "GC", "unmatched"), {200: 2.0e9},
    )
    assert chart.totals == (60, 80, 60)
    kafka, deser, gc, unmatched = chart.series
    assert kafka.samples == (50, 50, 0) and gc.samples == (10, 0, 0) and unmatched.samples == (0, 0, 20)
    assert kafka.share == (pytest.approx(50 / 60), pytest.approx(50 / 80), 0.0)
    # interval 1: PID 100 Kafka 20 of 50 samples × 2e9, PID 200 all 30 samples × 2e9 × 30 / 40
    assert kafka.cycles[1] == pytest.approx(0.8e9 + 1.5e9)
    assert deser.cycles[2] == pytest.approx(0.8 * 3e9)
    payload = chart.to_json({"Kafka": 0, "Deserialize": 1, "GC": 2, "unmatched": 3})
    assert [s["task"] for s in payload["series"]] == [0, 1, 2, 3]
    assert payload["series"][0]["cycles"] == [8.333e8, 2.3e9, 0.0]  # 4 significant digits
    # without any cycles the chart carries samples and shares only
    bare = timeline.host_timeline("h", 10.0, 30.0, {1: {0: {"GC": 3}}}, {}, ("GC",))
    assert bare.to_json({"GC": 0})["series"][0]["cycles"] is None


def test_overhead_series_is_rss_and_cpu_per_interval() -> None:
    overhead = Overhead(timeline=(OverheadPoint(20.0, 3 * 2**20, 0.3), OverheadPoint(10.0, 2**20, 0.1)))
    series = timeline.overhead_series(overhead)
    assert series is not None
    assert series.t == (10.0, 20.0) and series.rss_mib == (1.0, 3.0)
    assert series.cpu_percent == (pytest.approx(1.0), pytest.approx(2.0))
    assert timeline.overhead_series(Overhead()) is None and timeline.overhead_series(None) is None


def test_report_carries_the_time_chart_and_sampler_health(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "runs", intervals=3, hostile=False)
    payload = read_payload(render_report(run_dir))
    (host,) = payload["timeline"]["hosts"]  # type: ignore[index]
    assert host["host"] == "node1" and len(host["totals"]) == 3 and len(host["series"]) == 6
    gc = next(s for s in host["series"] if payload["tasks"][s["task"]]["name"] == "GC")  # type: ignore[index]
    assert gc["samples"][1:] == [0, 0] and gc["samples"][0] > 0  # the crafted warm-up
    assert payload["timeline"]["window"] is None  # type: ignore[index]
    assert len(payload["overhead"]) == 1  # type: ignore[arg-type]
    html = (run_dir / "report" / "index.html").read_text()
    assert "interpreted only" in html and "dropped (ring buffer full" in html and 'id="time-chart"' in html


def test_report_of_a_capture_without_timeline_says_so(crafted_run: Path) -> None:
    payload = read_payload(render_report(crafted_run))
    assert payload["timeline"] == {"hosts": [], "window": None} and payload["overhead"] == []
    html = (crafted_run / "report" / "index.html").read_text()
    assert "No timeline in these captures" in html and "interpreted only" not in html
    assert "node1 PID 2201</span> no Java frames seen, 0 dropped (counts map full, 0.0%)" in html


def test_report_of_a_sub_window_shows_it_and_its_stacks_only(tmp_path: Path) -> None:
    from coordinator.analysis.engines import analyze

    run_dir = write_run_dir(tmp_path / "r", "r", timeline_hosts(), **TIMELINE_OPTIONS)
    analyze([run_dir], engine="in-process", window=SubWindow(0, 10))
    run = load_run(run_dir)
    assert run.host_intervals("h1") == (0, 0)
    payload = read_payload(render_report(run_dir))
    assert payload["timeline"]["window"] == {"from": 0.0, "to": 10.0}  # type: ignore[index]
    graphs = {g["key"]: g for g in payload["graphs"]}  # type: ignore[attr-defined]
    assert graphs["host:h1"]["samples"] == 70  # interval 0 only: 60 + 10
    assert graphs["task:GC"]["samples"] == 10 and graphs["task:Deserialize"]["samples"] == 0
    html = (run_dir / "report" / "index.html").read_text()
    assert "0–10 s of the window (--from 0 --to 10; whole 10 s intervals)" in html


def test_unreadable_timeline_is_a_health_problem(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path / "r", "r", timeline_hosts(), **TIMELINE_OPTIONS)
    bad = run_dir / "hosts" / "h1" / "pids" / "200" / "timeline.folded"
    bad.write_text("not a timeline line\n")
    run = load_run(run_dir)
    capture = read_capture(run_dir / "hosts" / "h1")
    inputs = load_timeline(capture)
    assert inputs is not None
    view = build_view(run, {}, timelines={"h1": inputs})
    assert any("PID 200: left out of the time chart" in line.text for line in view.health)
    assert len(view.payload["timeline"]["hosts"][0]["series"]) == 4  # PID 100 alone: Kafka, Deserialize, GC, unmatched


def test_time_chart_series_match_the_summary(tmp_path: Path) -> None:
    # the chart's samples per task, summed over intervals, are the summary's samples per task
    from coordinator.analysis.engines import analyze

    run_dir = write_run_dir(tmp_path / "r", "r", timeline_hosts(), **TIMELINE_OPTIONS)
    analyze([run_dir], engine="in-process")
    payload = read_payload(render_report(run_dir))
    names = [t["name"] for t in payload["tasks"]]  # type: ignore[attr-defined]
    chart = {names[s["task"]]: sum(s["samples"]) for s in payload["timeline"]["hosts"][0]["series"]}  # type: ignore[index]
    assert chart == {"Kafka": 160, "Deserialize": 70, "GC": 10, "unmatched": 20}


def test_wall_clock_overshoot_is_no_interval_and_the_final_reading_closes_the_last_one() -> None:
    # GIVEN a real 30 s window at 5 s intervals: meta says 30.0006 s, the counters timeline numbers
    # its final reading 6 (intervals 0-4 and 6), the stacks use intervals 0-5
    meta = replace(META, interval=5.0, start_time=1000.0, end_time=1030.0006)
    assert timeline.interval_count(meta.duration, 5.0) == 6
    assert timeline.interval_count(31.0, 10.0) == 4  # a real partial interval still counts
    full = timeline.resolve_span(SubWindow(0, 30), meta, "cap")
    assert full.whole and (full.first, full.last) == (0, 5)
    deltas = [CounterDelta(i, 1e9 * (i + 1), None, 0.1) for i in (0, 1, 2, 3, 4, 6)]
    last = timeline.resolve_span(SubWindow(25, None), meta, "cap")
    counters = PidCounters(1, {}, cycles=2.2e10, cycles_estimated=False)
    assert timeline.window_counters(counters, deltas, last).cycles == 7e9
    assert [d.interval for d in timeline.clamp_deltas(deltas, 6)] == [0, 1, 2, 3, 4, 5]
    merged = timeline.clamp_deltas([CounterDelta(5, 1.0, None, 0.5), CounterDelta(6, 2.0, None, None)], 6)
    assert merged == [CounterDelta(5, 3.0, None, 0.5)]


def test_health_panel_names_cut_stacks_and_unnamed_interpreted_frames_per_pid() -> None:
    from types import SimpleNamespace

    from coordinator.report.health import _walk_health
    from profiler.capture.format import SamplerStats

    # GIVEN one PID with 8 % of its samples cut at a native frame, one with 1 % of frames unnamed, one healthy
    sampler = {
        1: SamplerStats(pid=1, samples=100, stacks_cut={"ended at a native frame": 8}),
        2: SamplerStats(pid=2, samples=100, interpreted_frames=1000, interpreted_unnamed={"stale Method*": 10}),
        3: SamplerStats(pid=3, samples=100),
    }
    capture = SimpleNamespace(meta=SimpleNamespace(host="h1"), sampler=sampler)
    lines = _walk_health([capture])  # type: ignore[list-item]
    # THEN a warning for the cut stacks, an ok line for the few unnamed frames, nothing for the healthy PID
    assert [(line.level, line.topic) for line in lines] == [("warn", "h1 PID 1 stacks"), ("ok", "h1 PID 2 stacks")]
    assert "8.0 % of samples cut (ended at a native frame 8.0 %)" in lines[0].text
    assert "1.0 % of 1000 interpreted frames unnamed (stale Method*: 10)" in lines[1].text


def test_health_panel_says_per_jvm_how_many_compiled_samples_were_named_from_a_borrowed_scope() -> None:
    from types import SimpleNamespace

    from coordinator.report.health import _inlining_health
    from profiler.capture.format import SamplerStats

    sampler = {
        1: SamplerStats(pid=1, samples=100, compiled_samples=80, compiled_approximate=76, approximate_bytes=76 * 40),
        2: SamplerStats(pid=2, samples=100, compiled_samples=80, compiled_approximate=4, approximate_bytes=4 * 40),
        3: SamplerStats(pid=3, samples=100, compiled_samples=80),
    }
    capture = SimpleNamespace(meta=SimpleNamespace(host="h1"), sampler=sampler)
    lines = _inlining_health([capture])  # type: ignore[list-item]
    levels = [(line.level, line.topic) for line in lines]
    assert levels == [("warn", "h1 PID 1 inlining"), ("info", "h1 PID 2 inlining")]
    assert lines[0].text.startswith("95 % of 80 compiled samples in code without exact debug information")
    assert "methods inlined there may be charged to their caller" in lines[0].text
