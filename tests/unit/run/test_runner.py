"""The run loop with fake components: what enters and leaves the scope, what is written, and that a
stop request or a failure still leaves a complete capture."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import profiler.engines.events as events_module
from profiler.capture import format as capture
from profiler.capture.folded import format_folded
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import (
    read_contexts,
    read_counters,
    read_counters_timeline,
    read_events,
    read_meta,
    read_net,
    read_overhead,
    read_pid_offcpu,
    read_pid_offcpu_timeline,
    read_scope,
    read_spark_plans,
    read_stack_counts,
    read_timeline,
)
from profiler.capture.stackstore import CollectedStacks
from profiler.engines.events import EventCounter
from profiler.errors import NothingToSampleError
from profiler.matching.appprofile import parse_profile
from profiler.run.runner import Components, Runner, RunOptions
from profiler.run.window import command_started_ns, seconds_since

PROFILE_TEXT = "Alpha: burnAlpha\nBeta: burnBeta\nGC: GC Thread\n"


def proc(pid: int, role: str = "workload", kind: str = "executor") -> capture.ProcessInfo:
    return capture.ProcessInfo(pid, role, "spark", kind, "root", f"java {kind}", 0.0, 0.0, preserve_frame_pointer=True)


class FakeScope:
    exec_watch_mode = "tracepoint"

    def __init__(self, initial: list[capture.ProcessInfo], later: list[capture.ProcessInfo], exits: list[int]) -> None:
        self.initial, self.later, self.exits = initial, later, exits
        self.polls = 0
        self.closed = False

    def start(self) -> None:
        pass

    def processes(self) -> list[capture.ProcessInfo]:
        """Every process found so far, as the real analyzer answers."""
        return list(self.initial) + (list(self.later) if self.polls >= 2 else [])

    def poll(self) -> tuple[list[capture.ProcessInfo], list[int]]:
        self.polls += 1
        if self.polls == 2:
            return list(self.later), []
        if self.polls == 3:
            return [], list(self.exits)
        return [], []

    def finish(self, end_time: float) -> list[capture.ProcessInfo]:
        return self.initial + self.later

    def close(self) -> None:
        self.closed = True


class FakeSampler:
    """Hands back fixed stacks, all in timeline interval 0 (the real sampler is tested in integration)."""

    collection = "ringbuf"
    stack_walk = "bpf"
    max_stack_depth = 127
    thread_names = "comm"
    first_sample: tuple[int, float] | None = None  # set by a test: (CLOCK_MONOTONIC ns, agent CPU-s then)

    def __init__(self, stacks: dict[int, Counter[str]], fail_collect: bool = False) -> None:
        self.stacks = stacks
        self.added: list[int] = []
        self.exited: list[int] = []
        self.started = self.stopped = self.closed = self.window_begun = False
        self.fail_collect = fail_collect
        self.warnings: list[str] = []
        self.batches = 0

    def start(self) -> None:
        self.started = True

    def begin_window(self) -> None:
        self.window_begun = True

    def sample_count(self, pid: int) -> int:
        return sum(self.stacks.get(pid, Counter()).values())

    def add_pid(self, pid: int) -> None:
        self.added.append(pid)

    def prepare_symbols(self, pid: int) -> None:
        pass

    def pid_exited(self, pid: int) -> None:
        self.exited.append(pid)

    def stop(self) -> None:
        self.stopped = True

    def checkpoint(self) -> None:
        return None  # checkpoints are tested in tests/unit/capture/test_checkpoint.py

    def name_batch(self) -> int:
        self.batches += 1
        return 0

    def collect(self) -> dict[int, CollectedStacks]:
        if self.fail_collect:
            raise RuntimeError("symbolizer exploded")
        return {
            pid: CollectedStacks.of_folded(
                counts,
                Counter({(0, stack): count for stack, count in counts.items()}),
                capture.SamplerStats(pid, samples=sum(counts.values())),
            )
            for pid, counts in self.stacks.items()
            if pid in self.added
        }

    def close(self) -> None:
        self.closed = True


class FakeCounters:
    """Cumulative counters: constant, or (``growing``) 1000 cycles and 0.5 CPU-s more with every read."""

    exits_note = ""

    def stop_exits(self) -> None:
        pass

    def __init__(self, growing: bool = False) -> None:
        self.added: list[int] = []
        self.closed = False
        self.growing = growing
        self.reads: Counter[int] = Counter()

    def add_pid(self, pid: int) -> None:
        self.added.append(pid)

    def pid_exited(self, pid: int) -> None:
        pass

    def read(self, pid: int) -> capture.PidCounters:
        self.reads[pid] += 1
        clock = capture.CounterValue(2e9, True, 10, 10)
        n = self.reads[pid]
        cycles, cpu_seconds = (1000.0 * n, 0.5 * n) if self.growing else (1000.0, 2.0)
        return capture.PidCounters(
            pid, {"task-clock": clock}, cycles=cycles, cycles_estimated=True, cpu_seconds=cpu_seconds
        )

    def close(self) -> None:
        self.closed = True


class FakeEvents:
    warnings: list[str] = []

    def start(self, processes: object, window_start: float | None = None) -> None:
        pass

    def vertex_windows(self) -> list[capture.VertexWindow]:
        return []

    def flink_placement(self) -> tuple[list[capture.FlinkSubtask], list[capture.FlinkTaskManager]]:
        return [], []

    def add_process(self, process: capture.ProcessInfo) -> None:
        pass

    def finish(self, end_time: float) -> capture.EventCount:
        return capture.EventCount(500, "--events")


class FakeNet:
    warnings: list[str] = []

    def start(self) -> str:
        return "tracepoint"

    def add_pid(self, pid: int) -> None:
        pass

    def stop(self) -> None:
        pass

    def collect(self) -> dict[int, capture.NetStats]:
        return {101: capture.NetStats(101, bytes_sent=10, bytes_received=20)}

    def close(self) -> None:
        pass


class SteppedTime:
    """The window's clock for the runner: waiting advances it at once, so a 1.2 s window always holds its
    polls (at 0.5, 1.0 and 1.2 s) however loaded the host is; a stop still ends the wait."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def clock(self) -> float:
        return self.now


class SteppingEvent(threading.Event):
    def __init__(self, time: SteppedTime) -> None:
        super().__init__()
        self.time = time

    def wait(self, timeout: float | None = None) -> bool:
        if timeout and not self.is_set():
            self.time.now += timeout
        return self.is_set()


def make(
    tmp_path: Path,
    duration: float = 1.2,
    fail_collect: bool = False,
    net: bool = False,
    interval: float = 10.0,
    growing: bool = False,
    real_time: bool = False,
):
    profile_path = tmp_path / "profile.txt"
    profile_path.write_text(PROFILE_TEXT)
    out = tmp_path / "cap"
    out.mkdir()
    scope = FakeScope([proc(101), proc(200, "managing", "driver")], [proc(102)], [101])
    sampler = FakeSampler(
        {
            101: Counter({"main;run;burnAlpha": 3, "main;run;burnBeta": 1}),
            102: Counter({"GC Thread#0;gc": 4, "main;unknownThing": 4}),
        },
        fail_collect=fail_collect,
    )
    counters = FakeCounters(growing)
    components = Components(scope, sampler, counters, FakeNet() if net else None, FakeEvents())
    options = RunOptions(
        duration=duration, out=out, profile=profile_path, known_spes=profile_path, host="h1", net=net, interval=interval
    )
    if real_time:
        return Runner(options, components), components, out
    time = SteppedTime()
    return Runner(options, components, clock=time.clock, stop_event=SteppingEvent(time)), components, out


def read_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "h1_result.csv") as handle:
        return list(csv.DictReader(handle))


def test_full_window_writes_capture_with_mid_run_process(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, net=True)
    runner.run(parse_profile(PROFILE_TEXT))

    assert components.sampler.added == [101, 102]  # managing 200 is not sampled
    assert sorted(components.counters.added) == [101, 102, 200]  # every SPE process gets counters
    assert components.sampler.exited == [101]
    assert components.sampler.stopped and components.sampler.closed and components.scope.closed

    meta = read_meta(out)
    assert meta.stopped_by == "duration" and meta.exec_watch == "tracepoint" and meta.net == "tracepoint"
    assert meta.duration >= 1.2
    rows = read_rows(out)
    alpha = next(r for r in rows if r["pid"] == "101" and r["task"] == "Alpha")
    assert alpha["samples"] == "3" and float(alpha["share"]) == pytest.approx(0.75)
    assert float(alpha["cycles"]) == pytest.approx(750.0)
    gc = next(r for r in rows if r["pid"] == "102" and r["task"] == "GC")
    assert gc["samples"] == "4"
    assert {r["task"] for r in rows if r["pid"] == "200"} == {"*"}
    assert (out / "h1_unmatched.folded").read_text() == "main;unknownThing 4\n"
    assert format_folded(read_stack_counts(capture.table_path(out, 101))).startswith("main;run;burnAlpha 3\n")
    assert read_events(out).count == 500
    assert read_net(out, 101).bytes_received == 20
    assert (out / "application_profile.txt").read_text() == PROFILE_TEXT


def test_timeline_files_hold_the_window_by_interval(tmp_path: Path) -> None:
    # GIVEN a 1.2 s window cut into 0.4 s intervals and counters that grow with every read
    runner, components, out = make(tmp_path, duration=1.2, interval=0.4, growing=True)
    runner.run(parse_profile(PROFILE_TEXT))

    meta = read_meta(out)
    assert meta.format_version == capture.FORMAT_VERSION and meta.stack_collection == "ringbuf" and meta.interval == 0.4
    assert components.sampler.window_begun
    # THEN the stacks' timeline sums to the folded stacks
    assert read_timeline(out, 102) == read_timeline(out, 102, first=0, last=0)
    assert sum(read_timeline(out, 102).values()) == 8
    # AND the counter deltas of a process present all window add up to its final reading
    rows = read_counters_timeline(out, 102)
    assert [r.interval for r in rows] == sorted({r.interval for r in rows})
    # the window's last interval; the loop's sliver past the deadline belongs to it (1.2 s / 0.4 s = 3)
    assert rows[-1].interval == 2 and meta.intervals == 3
    final = read_counters(out, 102)
    assert sum(r.cycles for r in rows) == pytest.approx(final.cycles)
    assert sum(r.cpu_seconds for r in rows) == pytest.approx(final.cpu_seconds)
    # AND the profiler's own footprint has a point per interval and a baseline
    overhead = read_overhead(out)
    assert overhead.rss_baseline_bytes > 0
    assert 2 <= len(overhead.timeline) <= 4 and all(p.rss_bytes > 0 for p in overhead.timeline)
    # AND native frames were named in a batch at every interval's end, counted in overhead.json
    assert overhead.name_batches == len(overhead.timeline) == components.sampler.batches
    # AND the post-run step's CPU is measured beside its wall time (2 CPUs: at most twice the wall time)
    assert overhead.post_run_cpu_seconds is not None and overhead.post_run_cpu_seconds >= 0
    assert overhead.post_run_cpu_seconds <= 2 * overhead.post_run_seconds + 0.05


def test_stop_request_ends_window_early_and_writes_everything(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=60, real_time=True)
    threading.Timer(0.6, runner.request_stop).start()
    runner.run(parse_profile(PROFILE_TEXT))

    meta = read_meta(out)
    assert meta.stopped_by == "signal"
    assert meta.duration < 5
    assert read_rows(out)  # partial results present
    assert components.sampler.closed


def test_failure_after_window_still_writes_partial_capture(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=0.3, fail_collect=True)
    runner.run(parse_profile(PROFILE_TEXT))

    meta = read_meta(out)
    assert any("symbolizer exploded" in w for w in meta.warnings)
    # counters and scope still written although the stacks were lost
    assert read_counters(out, 101) is not None
    assert {p.pid for p in read_scope(out)} == {101, 102, 200}
    assert components.sampler.closed and components.counters.closed


def test_failure_inside_window_is_reraised_after_writing(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=5)

    def boom() -> tuple[list[capture.ProcessInfo], list[int]]:
        raise RuntimeError("scope broke")

    components.scope.poll = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="scope broke"):
        runner.run(parse_profile(PROFILE_TEXT))
    meta = read_meta(out)
    assert meta.stopped_by == "error"
    assert (out / "h1_result.csv").exists()
    assert components.sampler.closed


def test_warnings_raised_while_closing_reach_meta(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=0.3)
    components.sampler.warnings = ["sampled fine"]
    original_close = components.sampler.close

    def close_with_warning() -> None:
        original_close()
        components.sampler.warnings.append("kernel.perf_event_max_stack could not be restored to 127")

    components.sampler.close = close_with_warning
    runner.run(parse_profile(PROFILE_TEXT))
    warnings = read_meta(out).warnings
    assert "sampled fine" in warnings
    assert "kernel.perf_event_max_stack could not be restored to 127" in warnings


def test_event_counting_failure_is_a_warning_not_a_failed_run(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=0.6)

    def refuse(processes: object, window_start: float | None = None) -> None:
        raise ConnectionResetError("py4j answered garbage")

    components.events.start = refuse  # type: ignore[method-assign]
    runner.run(parse_profile(PROFILE_TEXT))
    meta = read_meta(out)
    assert meta.stopped_by == "duration"
    assert any("py4j answered garbage" in w for w in meta.warnings)
    assert read_rows(out)


class FakeSparkPlans:
    """A Spark driver whose REST API never answered, and one context-carrying stack (the sampler's part)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.added: list[int] = []

    def start(self, processes: object) -> None:
        self.started = [p.pid for p in processes]  # type: ignore[attr-defined]

    def add_process(self, process: capture.ProcessInfo) -> None:
        self.added.append(process.pid)

    def finish(self) -> dict[str, object]:
        return {"format_version": 1, "plans": [], "notes": ["no Spark driver REST API answered (drivers: 200)"]}


def test_spark_plans_and_contexts_are_written_and_a_missing_rest_api_is_a_warning(tmp_path: Path) -> None:
    # GIVEN a run whose Spark driver serves no REST API and whose sampler saw one task thread's context
    runner, components, out = make(tmp_path)
    components.spark_plans = FakeSparkPlans()
    task = "Executor task launch worker for task 0.0 in stage 3.0 (TID 7)"
    original = components.sampler.collect

    def collect_with_context() -> dict[int, CollectedStacks]:
        collected = original()
        first = collected[101]
        contexts = Counter({(task, "main;run;burnAlpha"): 2})
        return {**collected, 101: CollectedStacks.of_folded(first.folded, first.timeline, first.stats, contexts)}

    components.sampler.collect = collect_with_context  # type: ignore[method-assign]
    # WHEN the run ends
    runner.run(parse_profile(PROFILE_TEXT))
    # THEN spark.json says why there is no plan, meta.json carries it as a warning, and nothing failed
    assert read_spark_plans(out) == components.spark_plans.finish()
    meta = read_meta(out)
    assert any(w.startswith("Spark REST API: no Spark driver REST API answered") for w in meta.warnings)
    assert components.spark_plans.started == [101, 200] and components.spark_plans.added == [102]
    # AND the context refers to its stack in the stack table
    assert read_contexts(out, 101) == Counter({(task, "main;run;burnAlpha"): 2})
    assert read_contexts(out, 102) is None
def test_flink_rest_api_that_does_not_answer_gives_a_health_line_and_a_complete_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a JobManager in the scope whose REST API answers nothing (issue 22, item 6)
    monkeypatch.setattr(events_module, "discover_flink", lambda process, fetch, *rest: None)
    runner, components, out = make(tmp_path, duration=0.6)
    jobmanager = capture.ProcessInfo(300, "managing", "flink", "jobmanager", "root",
                             "java org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint", 0.0, 0.0)
    components.scope.initial.append(jobmanager)  # type: ignore[attr-defined]
    components.events = EventCounter(fetch=lambda url: {}, poll_seconds=0.1)
    # WHEN the run ends; THEN it is complete, events.json says why there is no count, meta.json has
    # the health line, and there is no flink.json
    runner.run(parse_profile(PROFILE_TEXT))
    meta = read_meta(out)
    assert meta.stopped_by == "duration"
    assert any("flink REST API of pid 300 did not answer" in w and "--events N" in w for w in meta.warnings)
    events = read_events(out)
    assert events is not None and events.count is None and "pid 300" in events.detail
    assert not (out / capture.FLINK_FILE).exists()
    assert read_rows(out)


def test_event_counting_starts_at_the_window_start_before_processes_are_entered(tmp_path: Path) -> None:
    # Entering a JVM prepares its symbols (seconds under load): Flink's first reading must not wait for it.
    runner, components, out = make(tmp_path, duration=0.3)
    seen: list[tuple[list[int], float | None]] = []

    def start(processes: object, window_start: float | None = None) -> None:
        seen.append((list(components.counters.added), window_start))  # type: ignore[attr-defined]

    components.events.start = start  # type: ignore[method-assign]
    runner.run(parse_profile(PROFILE_TEXT))
    assert seen == [([], read_meta(out).start_time)]


class FakeOffCpu:
    """Blocked time of the workload PIDs it was given (the real tracer runs in tests/integration/test_offcpu.py)."""

    warnings: list[str] = ["off-cpu: a fake warning"]

    def __init__(self) -> None:
        self.added: list[int] = []
        self.exited: list[int] = []
        self.order: list[str] = []
        self.ticks: list[int] = []
        self.interval_entries: dict[int, dict[int, list[OffCpuEntry]]] = {}

    def start(self) -> str:
        self.order.append("start")
        return "sched_switch"

    def tick(self, interval: int) -> None:
        self.ticks.append(interval)

    def add_pid(self, pid: int) -> None:
        self.added.append(pid)

    def pid_exited(self, pid: int) -> None:
        self.exited.append(pid)

    def stop(self) -> None:
        self.order.append("stop")

    def collect(self) -> dict[int, list[OffCpuEntry]]:
        self.order.append("collect")
        entries = {101: [OffCpuEntry("lock", "main;run;burnAlpha;futex_wait_[k]", 2_000_000_000, 4)]}
        self.interval_entries = {self.ticks[-1]: entries} if self.ticks else {}
        return {pid: entries.get(pid, []) for pid in self.added}

    def close(self) -> None:
        self.order.append("close")


def test_off_cpu_component_traces_workload_pids_and_its_time_reaches_files_rows_and_meta(tmp_path: Path) -> None:
    # GIVEN the usual fakes plus an off-CPU tracer that saw pid 101 blocked 2 s under burnAlpha
    runner, components, out = make(tmp_path)
    offcpu = FakeOffCpu()
    components.offcpu = offcpu
    runner.options = replace(runner.options, off_cpu=True, off_cpu_min_block_ms=2.5)
    # WHEN the run ends
    runner.run(parse_profile(PROFILE_TEXT))
    # THEN only workload PIDs were traced, in the lifecycle order, and the time is in the capture
    assert offcpu.added == [101, 102] and offcpu.order == ["start", "stop", "collect", "close"]
    assert offcpu.exited == [101]  # its time stays (below), its pid is no longer followed
    assert read_pid_offcpu(out, 101) == offcpu.collect()[101]
    # the per-interval split: every interval end was a tick, the last one holds the fake's time
    assert offcpu.ticks and offcpu.ticks == sorted(set(offcpu.ticks))
    assert read_pid_offcpu_timeline(out, 101) == {offcpu.ticks[-1]: offcpu.collect()[101]}
    assert read_pid_offcpu_timeline(out, 102) == {}
    assert read_pid_offcpu(out, 102) == [] and read_pid_offcpu(out, 200) is None
    rows = {(r["pid"], r["task"]): r for r in read_rows(out)}
    assert float(rows[("101", "Alpha")]["offcpu_lock_seconds"]) == 2.0
    assert float(rows[("101", "*")]["offcpu_seconds"]) == 2.0 and float(rows[("102", "*")]["offcpu_seconds"]) == 0
    assert rows[("200", "*")]["offcpu_seconds"] == ""  # managing: not traced, not measured
    meta = read_meta(out)
    assert meta.off_cpu_min_block_ms == 2.5 and "off-cpu: a fake warning" in meta.warnings


def test_the_off_cpu_tracer_closes_before_the_sampler_whose_jvm_namers_it_borrows(tmp_path: Path) -> None:
    # GIVEN an off-CPU tracer (its JVM thread watch reads through the sampler's namers) and a run that fails
    runner, components, _out = make(tmp_path)
    closed: list[str] = []
    offcpu = FakeOffCpu()
    offcpu.close = lambda: closed.append("offcpu")  # type: ignore[method-assign]
    sampler_close = components.sampler.close

    def close_sampler() -> None:
        closed.append("sampler")
        sampler_close()

    components.sampler.close = close_sampler  # type: ignore[method-assign]
    components.offcpu = offcpu
    runner.options = replace(runner.options, off_cpu=True)
    # WHEN the run ends
    runner.run(parse_profile(PROFILE_TEXT))
    # THEN the borrower closed first: the namers' descriptors are never read after the sampler closed them
    assert closed == ["offcpu", "sampler"]


def test_without_off_cpu_the_columns_are_empty_and_no_file_is_written(tmp_path: Path) -> None:
    runner, _components, out = make(tmp_path)
    runner.run(parse_profile(PROFILE_TEXT))
    assert all(r["offcpu_seconds"] == "" for r in read_rows(out))
    assert not list(out.glob("pids/*/offcpu.folded")) and read_meta(out).off_cpu_min_block_ms is None


class LeavingScope(FakeScope):
    """The real analyzer's finish(): a process found gone keeps ``exited`` and the time it was found gone."""

    def __init__(self, initial: list[capture.ProcessInfo], exits: list[int], gone_at: float) -> None:
        super().__init__(initial, [], exits)
        self.gone_at = gone_at

    def finish(self, end_time: float) -> list[capture.ProcessInfo]:
        return [replace(p, exited=True, last_seen=self.gone_at) if p.pid in self.exits else p for p in self.initial]


def test_a_pid_gone_before_the_window_and_one_gone_during_it_are_lines_and_the_rest_is_written(
    tmp_path: Path,
) -> None:
    # GIVEN --pid 101 999 (999 gone before the scope started) and 101 found gone at the window's third poll
    runner, components, out = make(tmp_path, duration=3.0)
    start = runner.clock()
    components.scope = LeavingScope([proc(101), proc(102)], [101], gone_at=start + 1.5)
    runner.options = replace(runner.options, pids=(101, 999))
    runner.run(parse_profile(PROFILE_TEXT))
    # THEN the run ends normally with both departures in meta.json's warnings
    meta = read_meta(out)
    assert meta.stopped_by == "duration"
    gone_before = [w for w in meta.warnings if w.startswith("--pid 999: exited before the window began")]
    gone_during = [w for w in meta.warnings if w.startswith("pid 101 (executor") and "+1.5 s into" in w]
    assert len(gone_before) == 1 and len(gone_during) == 1, meta.warnings
    assert "its 4 samples up to then are kept" in gone_during[0]
    assert not any("no workload process was found" in w for w in meta.warnings)
    # AND the process that left keeps its samples, the other one its own
    assert format_folded(read_stack_counts(capture.table_path(out, 101))).startswith("main;run;burnAlpha 3\n")
    assert {p.pid: p.exited for p in read_scope(out)} == {101: True, 102: False}


def test_every_pid_gone_before_a_sample_is_one_line_exit_7_and_a_written_capture(tmp_path: Path) -> None:
    # GIVEN --pid 999, gone before the scope started, and no other workload process on the host
    runner, components, out = make(tmp_path, duration=1.0)
    components.scope = FakeScope([], [], [])
    runner.options = replace(runner.options, pids=(999,))
    status = tmp_path / "status.json"
    runner.status.path = status
    # WHEN the run ends THEN it raises the "nothing to sample" error after writing the capture
    with pytest.raises(NothingToSampleError, match=r"^nothing to sample: --pid 999 exited before") as caught:
        runner.run(parse_profile(PROFILE_TEXT))
    assert caught.value.exit_code == 7 and "\n" not in str(caught.value)
    meta = read_meta(out)
    assert meta.stopped_by == "duration"
    assert any(w.startswith("--pid 999: exited before the window began") for w in meta.warnings)
    assert json.loads(status.read_text())["state"] == "failed"
    assert components.sampler.closed and components.scope.closed


def test_a_scoped_run_without_a_pid_that_finds_nothing_still_ends_normally(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=1.0)
    components.scope = FakeScope([], [], [])
    runner.run(parse_profile(PROFILE_TEXT))
    assert "no workload process was found: check --known-spes or add --pid" in read_meta(out).warnings


def test_overhead_says_when_the_window_began_and_the_first_sample_came_since_the_command(tmp_path: Path) -> None:
    # GIVEN a sampler whose first sample came at a known monotonic time, with the agent at 0.75 CPU-s
    runner, components, out = make(tmp_path, duration=0.4, real_time=True)
    started = command_started_ns()
    assert started is not None and started <= time.monotonic_ns()
    first_ns = time.monotonic_ns() + 250_000_000
    components.sampler.first_sample = (first_ns, 0.75)
    # WHEN the run is written
    runner.run(parse_profile(PROFILE_TEXT))
    overhead = read_overhead(out)
    # THEN both are seconds since this process began, the window's before the first sample's
    assert overhead.first_sample_at == pytest.approx((first_ns - started) / 1e9, abs=0.03)
    assert overhead.first_sample_cpu_seconds == 0.75
    assert overhead.window_start_at is not None and 0 < overhead.window_start_at < overhead.first_sample_at + 1


def test_a_run_without_a_sample_writes_no_first_sample(tmp_path: Path) -> None:
    runner, components, out = make(tmp_path, duration=0.4, real_time=True)
    runner.run(parse_profile(PROFILE_TEXT))
    overhead = read_overhead(out)
    assert overhead.first_sample_at is None and overhead.first_sample_cpu_seconds is None
    assert overhead.window_start_at is not None


def test_the_command_start_is_the_process_start_on_the_monotonic_clock() -> None:
    # GIVEN a child process started now, WHEN it reads its own start, THEN it is within a tick or two of now
    before = time.monotonic_ns()
    code = "from profiler.run.window import command_started_ns; print(command_started_ns())"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    argv = [sys.executable, "-c", code]
    child = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60, env=env)
    after = time.monotonic_ns()
    started = int(child.stdout)
    assert before - 30_000_000 <= started <= after
    assert seconds_since(started, started + 1_500_000_000) == 1.5 and seconds_since(None, started) is None


def test_overhead_splits_the_windows_cpu_by_component(tmp_path: Path) -> None:
    # GIVEN a scope whose every poll burns 60 ms of the runner thread's CPU, over a 1.6 s window
    runner, components, out = make(tmp_path, duration=1.6, real_time=True)
    poll = components.scope.poll

    def costly_poll() -> tuple[list[capture.ProcessInfo], list[int]]:
        began = time.thread_time()
        while time.thread_time() - began < 0.06:
            pass
        return poll()

    components.scope.poll = costly_poll  # type: ignore[method-assign]
    runner.run(parse_profile(PROFILE_TEXT))
    overhead = read_overhead(out)
    by_component = {part.component: part.cpu_seconds for part in overhead.cpu_by_component}
    # THEN the scope's polls are its own component, and the components add up to the window's CPU
    polls = components.scope.polls
    assert polls >= 3 and by_component["scope"] == pytest.approx(0.06 * polls, abs=0.03)
    assert sum(by_component.values()) == pytest.approx(overhead.profiler_cpu_seconds, abs=0.03)
