"""The writer of profiler/run/: a capture from one Collected value alone (no component, no runner), and
the room's shape (the writer and recovery never reach the runner; no module over 700 lines, no class
over 400)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from profiler.capture import format as capture
from profiler.capture.folded import format_folded
from profiler.capture.format import CounterValue, Overhead, PidCounters, ProcessInfo, SamplerStats
from profiler.capture.read import read_meta, read_overhead, read_scope, read_stack_counts
from profiler.capture.stackstore import CollectedStacks
from profiler.matching.appprofile import parse_profile
from profiler.run.options import RunOptions
from profiler.run.write import Collected, write_capture

RUN = Path(__file__).resolve().parents[3] / "profiler" / "run"
PROFILE_TEXT = "Alpha: burnAlpha\nBeta: burnBeta\n"


def options(tmp_path: Path) -> RunOptions:
    profile = tmp_path / "profile.txt"
    profile.write_text(PROFILE_TEXT)
    out = tmp_path / "cap"
    out.mkdir()
    return RunOptions(duration=20.0, out=out, profile=profile, known_spes=profile, host="h1", interval=10.0)


def collected(**changes: object) -> Collected:
    process = ProcessInfo(101, "workload", "spark", "executor", "root", "java executor", 0.0, 0.0)
    counters = PidCounters(101, {"cycles": CounterValue(4e9, True, 1, 1)}, 4e9, False, cpu_seconds=2.0)
    stacks = CollectedStacks.of_folded(
        Counter({"main;burnAlpha": 3, "main;burnBeta": 1}),
        Counter({(0, "main;burnAlpha"): 2, (1, "main;burnAlpha"): 1, (1, "main;burnBeta"): 1}),
        SamplerStats(101, samples=4),
    )
    values: dict[str, object] = {
        "start_time": 1000.0, "end_time": 1020.0, "stopped_by": "duration", "window_started": True,
        "exec_watch": "tracepoint", "net_mode": None, "stack_collection": "ringbuf", "stack_walk": "bpf",
        "max_stack_depth": 1024, "thread_names": "uprobe", "cycles_source": "hardware",
        "processes": [process], "counters": {101: counters}, "stacks": {101: stacks},
        "warnings": ("a warning", "a warning"), "cost": Overhead(profiler_cpu_seconds=0.25),
    }  # fmt: skip
    return Collected(**{**values, **changes})  # type: ignore[arg-type]


def test_the_writer_needs_only_what_was_collected(tmp_path: Path) -> None:
    # GIVEN what a run collected, as one value (no component behind it)
    run = options(tmp_path)
    # WHEN it is written
    meta = write_capture(run, collected(), parse_profile(PROFILE_TEXT))
    # THEN an ordinary capture: meta from the value, stacks and rows matched, the window's cost kept
    assert meta == read_meta(run.out)
    assert (meta.stopped_by, meta.cycles_source, meta.thread_names, meta.stack_walk) == (
        "duration", "hardware", "uprobe", "bpf",
    )
    assert meta.intervals == 2 and meta.warnings == ("a warning",)
    folded = format_folded(read_stack_counts(capture.table_path(run.out, 101)))
    assert "main;burnAlpha 3" in folded
    rows = (run.out / capture.result_file_name("h1")).read_text()
    assert "Alpha" in rows and "Beta" in rows
    overhead = read_overhead(run.out)
    assert overhead is not None and overhead.profiler_cpu_seconds == 0.25 and overhead.peak_rss_bytes > 0


def test_a_run_that_never_began_its_window_has_no_timeline(tmp_path: Path) -> None:
    run = options(tmp_path)
    never_began = collected(window_started=False, stacks={}, stopped_by="signal")
    meta = write_capture(run, never_began, parse_profile(PROFILE_TEXT))
    assert meta.intervals == 0 and meta.stopped_by == "signal"
    assert [p.pid for p in read_scope(run.out)] == [101]


def imported_run_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module)
    return found


def test_the_writer_and_recovery_never_reach_the_runner() -> None:
    assert imported_run_modules(RUN / "write.py") <= {"options"}
    assert imported_run_modules(RUN / "recovery.py") <= {"options", "write"}


def test_no_module_of_the_room_is_over_700_lines_nor_a_class_over_400() -> None:
    for path in sorted(RUN.glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 700, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None and node.end_lineno - node.lineno < 400, (path.name, node.name)
