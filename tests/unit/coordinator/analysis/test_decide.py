"""The analysis reads stack tables directly (frames matched once, stacks decided from frame ids) and gives
exactly what the same samples give as folded text: a real-derived capture converted both ways."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path

import pytest

from coordinator.analysis.decide import TaskDecider
from coordinator.analysis.engines import analyze
from coordinator.analysis.load import load_run, load_timeline
from coordinator.analysis.timeline import SubWindow
from coordinator.report.view import time_series
from profiler.capture import format as capture
from profiler.capture.folded import read_folded
from profiler.capture.stacktable import (
    StackTable,
    StackTableBuilder,
    encode_table,
    read_table,
    table_from_folded,
    write_table,
)
from profiler.errors import CaptureFormatError
from profiler.files import atomic
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher
from profiler.run.recovery import recover_capture
from tests.fixtures.captures import PidSpec, to_compact, to_folded, write_run_dir
from tests.unit.capture.test_checkpoint import GONE_PID, FakeKernel, libc_function, write_journal

ROOT = Path(__file__).resolve().parents[4]
REAL_STACKS = ROOT / "tests" / "data" / "spark_executor_real.folded"
PROFILE = (ROOT / "application_profiles" / "spark_structured_streaming.txt").read_text(encoding="utf-8")
INTERVALS = 6


def _task_thread(number: int) -> str:
    return f"Executor task launch worker for task {number % 3}.0 in stage {10 + number % 4}.0 (TID {number})"


def _real_table(pid: int) -> StackTable:
    """The real executor's stacks as one PID's table: a subset per PID, spread over intervals, and the
    samples of some task-thread stacks given a Spark task context."""
    folded = read_folded(REAL_STACKS)
    timeline: Counter[tuple[int, str]] = Counter()
    contexts: Counter[tuple[str, str]] = Counter()
    for number, (stack, count) in enumerate(sorted(folded.items())):
        if (number + pid) % 3 == 0:
            continue
        first = count // 2
        timeline[((number + pid) % INTERVALS, stack)] += first
        timeline[((number * 7 + pid) % INTERVALS, stack)] += count - first
        if stack.startswith("Executor task l") and number % 2:
            contexts[(_task_thread(number), stack)] += max(1, count // 3)
    return table_from_folded(+Counter({s: n for (_i, s), n in timeline.items()}), timeline, contexts)


def _real_run(tmp_path: Path) -> Path:
    """A run of two hosts, three executors in all, as a format 4 capture (stack tables)."""
    hosts = {
        "h1": [PidSpec(50, role="managing", kind="driver", cycles=1e8, cpu_seconds=0.1),
               PidSpec(101, {"x;y": 1}, cycles=3e10, cpu_seconds=12.0, instructions=4e10),
               PidSpec(102, {"x;y": 1}, cycles=2e10, cpu_seconds=9.0)],
        "h2": [PidSpec(201, {"x;y": 1}, cycles=1e10, cpu_seconds=4.0, cycles_estimated=True)],
    }
    run = write_run_dir(tmp_path / "runs" / "real", "real", hosts, PROFILE, labels={"load": "50k"},
                        duration=60.0, stack_collection="ringbuf")
    for host, specs in hosts.items():
        for spec in specs[1:] if host == "h1" else specs:
            write_table(capture.table_path(run / "hosts" / host, spec.pid), _real_table(spec.pid),
                        atomic.atomic_write_chunks)
            capture.stacks_path(run / "hosts" / host, spec.pid).unlink()
    return run


def _outputs(run: Path, out: Path) -> dict[str, bytes]:
    """Every analysis output of the run (whole window with stage rows, and a sub-window), and the report's
    time chart, as bytes."""
    analyze([run], out_dir=out / "all", engine="in-process", by="stage")
    analyze([run], out_dir=out / "sub", engine="in-process", window=SubWindow(10, 40))
    files = {f"{cut}/{p.name}": p.read_bytes() for cut in ("all", "sub") for p in sorted((out / cut).iterdir())}
    data = load_run(run)
    matcher = Matcher(parse_profile(PROFILE))
    for host in data.hosts:
        assert host.capture is not None
        timeline = load_timeline(host.capture)
        assert timeline is not None
        problems: list[str] = []
        charts = time_series({host.name: timeline}, matcher, matcher.result_names, problems)
        assert not problems
        files[f"chart/{host.name}"] = repr([c.to_json({t: i for i, t in enumerate(matcher.result_names)})
                                             for c in charts]).encode()
    return files


def test_a_real_derived_capture_analyses_to_the_same_bytes_as_stack_tables_and_as_folded_text(
    tmp_path: Path,
) -> None:
    # GIVEN a run whose executors hold real stacks with a timeline and Spark task contexts, as stack tables
    run = _real_run(tmp_path)
    assert len(list(run.rglob("stacks.tpc"))) == 3 and not list(run.rglob("pids/*/*.folded"))
    # WHEN it is analysed as it is, then converted in place to folded text (format 3) and analysed again
    compact = _outputs(run, tmp_path / "compact")
    for host in ("h1", "h2"):
        to_folded(run / "hosts" / host)
    assert not list(run.rglob("stacks.tpc")) and len(list(run.rglob("contexts.json"))) == 3
    folded = _outputs(run, tmp_path / "folded")
    # AND converted back to stack tables
    for host in ("h1", "h2"):
        to_compact(run / "hosts" / host)
    again = _outputs(run, tmp_path / "again")
    # THEN summary.csv (with its stage rows), analysis.json, unmatched.folded and the time chart are identical
    assert sorted(compact) == sorted(folded) == sorted(again)
    assert {"all/summary.csv", "all/analysis.json", "all/unmatched.folded", "sub/summary.csv"} <= set(compact)
    for name in compact:
        assert compact[name] == folded[name] == again[name], name
    summary = compact["all/summary.csv"].decode()
    assert ",stage," in summary.splitlines()[0] and summary.count("\n") > 40
    assert compact["all/unmatched.folded"] and compact["sub/summary.csv"] != compact["all/summary.csv"]


def test_the_decider_gives_a_table_and_its_folded_text_the_same_sums() -> None:
    # GIVEN a real-derived table and its folded text, and one decider that reads both
    table = _real_table(101)
    decider = TaskDecider(Matcher(parse_profile(PROFILE)))
    # WHEN both are decided, whole window and intervals 2..3
    for window in (None, (2, 3)):
        from_table = decider.table(table, window)
        from_text = decider.folded(table.folded(*(window or (None, None))))
        # THEN samples, multi-task samples, unmatched stacks and distinct stacks agree
        assert from_table == from_text
    assert from_table.total and any(from_table.multi) and from_table.unmatched
    assert len(from_table.fingerprints) < len(table.stacks)


def test_frames_are_matched_once_per_distinct_frame_over_many_tables(tmp_path: Path) -> None:
    # GIVEN two executors' tables of real stacks on disk, each with its own frame ids
    matcher = Matcher(parse_profile(PROFILE))
    decider = TaskDecider(matcher)
    paths = []
    for pid in (101, 102):
        paths.append(tmp_path / str(pid) / "stacks.tpc")
        paths[-1].parent.mkdir()
        write_table(paths[-1], _real_table(pid), atomic.atomic_write_chunks)
    # WHEN one decider reads both, then the first again
    first = decider.read(paths[0])
    decider.read(paths[1])
    seen = matcher.distinct_frames_seen
    again = decider.read(paths[0])
    # THEN each distinct frame text of the two tables was matched once, and the readings agree
    texts = {text for path in paths for text in read_table(path).frame_texts()}
    assert matcher.distinct_frames_seen == seen == len(texts)
    assert first == again


def test_same_named_frames_of_two_modules_count_as_one_stack() -> None:
    # GIVEN a table where two stacks differ only in a frame's module (they fold to the same text)
    builder = StackTableBuilder()
    root = builder.frame("Executor task l", "thread")
    for module in ("libjvm.so", "libother.so"):
        leaf = builder.frame("JsonParser.nextToken", "native", module)
        builder.add(0, builder.stack((root, leaf)), None, 5)
    table = builder.build()
    # THEN the decider counts their samples once per task and the stack once
    sums = TaskDecider(Matcher(parse_profile(PROFILE))).table(table)
    assert sums.total == 10 and len(sums.fingerprints) == 1
    assert sums == TaskDecider(Matcher(parse_profile(PROFILE))).folded(table.folded())


def test_a_capture_rebuilt_by_recover_analyses_as_its_folded_twin(tmp_path: Path) -> None:
    # GIVEN the capture `profiler recover` rebuilt from the journal of a killed run (stack tables)
    recovered = tmp_path / "tables" / "cap"
    recovered.mkdir(parents=True)
    address, maps = libc_function("getpid")
    write_journal(recovered, maps, address)
    recover_capture(recovered, kernel=FakeKernel)
    assert capture.table_path(recovered, GONE_PID).is_file()
    twin = tmp_path / "folded" / "cap"  # the same run id: the directory's name
    twin.parent.mkdir()
    shutil.copytree(recovered, twin)
    to_folded(twin)
    # WHEN both are analysed
    for form in ("tables", "folded"):
        analyze([tmp_path / form / "cap"], out_dir=tmp_path / f"{form}-out", engine="in-process")
    # THEN every sample is counted in its task, and both forms give the same summary
    summary = (tmp_path / "tables-out" / "summary.csv").read_text()
    assert f"node9,{GONE_PID},workload,spark,Getpid,21," in summary
    for name in ("summary.csv", "unmatched.folded"):
        assert (tmp_path / "tables-out" / name).read_bytes() == (tmp_path / "folded-out" / name).read_bytes()


def test_a_table_with_a_frame_name_no_file_can_hold_is_one_line_naming_it(tmp_path: Path) -> None:
    # GIVEN a capture whose table's header escapes a lone surrogate (valid JSON, not UTF-8 text)
    run = write_run_dir(tmp_path / "run", "run", {"h1": [PidSpec(7, {"x;y": 1}, cycles=1e9)]})
    builder = StackTableBuilder()
    builder.add(0, builder.stack((builder.frame("main", "thread"), builder.frame("XXXXXX", "jit"))), None, 3)
    raw = encode_table(builder.build()).replace(b"XXXXXX", b"\\ud800")
    path = capture.table_path(run / "hosts" / "h1", 7)
    path.write_bytes(gzip.compress(raw))
    capture.stacks_path(run / "hosts" / "h1", 7).unlink()
    # WHEN it is analysed, THEN one error names the file and the fix
    with pytest.raises(CaptureFormatError, match=r"stacks.tpc: a frame name is not UTF-8 text.*re-fetch"):
        analyze([run], engine="in-process")
