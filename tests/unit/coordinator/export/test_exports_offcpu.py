"""Off-CPU time in the exports (docs/exports.md, issue 31): pprof's second sample type off_cpu/nanoseconds
and speedscope's off-CPU profiles (unit nanoseconds), parsed back and checked against the blocked seconds
per PID and task the capture's result CSV (and the analysis) counted."""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze
from coordinator.analysis.timeline import SubWindow
from coordinator.export.files import render
from coordinator.export.pprof import CAUSE_LABEL, LABEL_KEYS, decode
from coordinator.export.speedscope import build_speedscope
from coordinator.export.stacks import TASK_FRAME_PREFIX, load_export_set, select
from profiler.capture.format import ALL_TASKS, result_file_name
from profiler.capture.offcpu import OffCpuEntry
from tests.fixtures.exports import pprof_totals, validate_speedscope
from tests.fixtures.report import HOSTILE_FRAMES, spark_stacks, write_capture

ENTRIES = {
    2201: [
        OffCpuEntry("net", "Executor task l;org/apache/kafka/Poll.run;ep_poll_[k]", 3_000_000_000, 40),
        OffCpuEntry("monitor", f"Executor;KafkaDataConsumer.get;{HOSTILE_FRAMES[0]};futex_wait_[k]", 500_000_000, 9),
        OffCpuEntry("lock", f"Executor;KafkaDataConsumer.get;{HOSTILE_FRAMES[0]};futex_wait_[k]", 1_250_000, 2),
        OffCpuEntry("safepoint", "GC Thread#0;SafepointSynchronize::block", 250_000_000, 30),
    ],
    2202: [OffCpuEntry("sleep", "Executor;[blocked all window];java.lang.Thread::sleep;futex_wait_[k]", 7_000_000, 1)],
}


@pytest.fixture
def offcpu_capture(tmp_path: Path) -> Path:
    capture = tmp_path / "cap"
    stacks = {2201: spark_stacks(0), 2202: spark_stacks(1)}
    write_capture(capture, "node1", stacks, start=time.time() - 60, offcpu=ENTRIES)
    return capture


def _result_offcpu(capture: Path) -> dict[tuple[str, int, str], float]:
    """(host, pid, task) -> offcpu_seconds of the capture's <host>_result.csv (what the pre-aggregation counted)."""
    with open(capture / result_file_name("node1"), encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        (r["host"], int(r["pid"]), r["task"]): float(r["offcpu_seconds"])
        for r in rows
        if r["pid"] != ALL_TASKS and r["task"] != ALL_TASKS and r["offcpu_seconds"] not in ("", "0")
    }


def test_pprof_has_off_cpu_nanoseconds_per_pid_and_task_as_the_capture_counted(offcpu_capture: Path) -> None:
    # WHEN a capture of a run with --off-cpu is exported as pprof and parsed back with protobuf
    profile = decode(render(load_export_set(offcpu_capture), "pprof"))  # type: ignore[arg-type]
    strings = profile.string_table
    types = [(strings[t.type], strings[t.unit]) for t in profile.sample_type]
    # THEN a fourth sample type holds the blocked nanoseconds
    assert types == [("samples", "count"), ("cpu", "nanoseconds"), ("cycles", "count"), ("off_cpu", "nanoseconds")]
    assert strings[profile.default_sample_type] == "cpu"
    # AND per (host, pid, task) they are the capture's offcpu_seconds, exactly (whole nanoseconds)
    got = {key: ns / 1e9 for key, ns in pprof_totals(profile, 3).items() if ns}
    expected = _result_offcpu(offcpu_capture)
    assert got.keys() == expected.keys() and len(got) >= 3
    for key, seconds in expected.items():
        assert got[key] == pytest.approx(seconds, rel=1e-6), key
    # AND the off-CPU samples are samples of their own: 0 in the other types, labelled with their cause;
    # the on-CPU samples have 0 off-CPU time and the usual labels
    causes: Counter[str] = Counter()
    for sample in profile.sample:
        labels = {strings[lab.key]: strings[lab.str] for lab in sample.label}
        if sample.value[3]:
            assert list(sample.value[:3]) == [0, 0, 0] and tuple(labels) == (*LABEL_KEYS, CAUSE_LABEL)
            causes[labels[CAUSE_LABEL]] += sample.value[3]
        else:
            assert sample.value[0] > 0 and tuple(labels) == LABEL_KEYS
    assert causes == {"net": 3_000_000_000, "monitor": 500_000_000, "lock": 1_250_000, "safepoint": 250_000_000,
                      "sleep": 7_000_000}  # fmt: skip
    assert any("off_cpu" in strings[c] for c in profile.comment)


def test_pprof_of_a_run_without_off_cpu_keeps_its_three_types(tmp_path: Path) -> None:
    capture = tmp_path / "cap"
    write_capture(capture, "node1", {2201: spark_stacks(0)}, start=time.time() - 60)
    profile = decode(render(load_export_set(capture), "pprof"))  # type: ignore[arg-type]
    assert [profile.string_table[t.type] for t in profile.sample_type] == ["samples", "cpu", "cycles"]


@pytest.mark.parametrize("per_task", [False, True])
def test_speedscope_has_an_off_cpu_profile_per_process_in_nanoseconds(offcpu_capture: Path, per_task: bool) -> None:
    # WHEN exported as speedscope
    document = build_speedscope(load_export_set(offcpu_capture), per_task=per_task)
    validate_speedscope(document)
    frames = document["shared"]["frames"]
    # THEN after each process's profile its off-CPU profile(s): unit nanoseconds, weights the blocked time
    offcpu = [p for p in document["profiles"] if p["name"].endswith(" off-CPU")]
    on_cpu = [p for p in document["profiles"] if not p["name"].endswith(" off-CPU")]
    assert all(p["unit"] == "nanoseconds" for p in offcpu) and all(p["unit"] == "none" for p in on_cpu)
    totals: Counter[tuple[int, str]] = Counter()
    for profile in offcpu:
        assert profile["endValue"] == sum(profile["weights"])
        pid = int(profile["name"].partition(" PID ")[2].split(" ", 1)[0])
        for stack, weight in zip(profile["samples"], profile["weights"]):
            if per_task:
                task = profile["name"].rpartition(": task ")[2].removesuffix(" off-CPU")
            else:
                root = frames[stack[0]]["name"]
                assert root.startswith(TASK_FRAME_PREFIX)
                task = root[len(TASK_FRAME_PREFIX) : -1]
            totals[pid, task] += weight
    expected = {(pid, task): round(s * 1e9) for (_, pid, task), s in _result_offcpu(offcpu_capture).items()}
    assert dict(totals) == expected
    # AND the frames are the stacks' (hostile names are data: one frame each)
    assert {"name": HOSTILE_FRAMES[0]} in frames and {"name": "[blocked all window]"} in frames


def test_select_keeps_the_off_cpu_stacks_of_the_selection(offcpu_capture: Path) -> None:
    export = load_export_set(offcpu_capture)
    assert {s.process.pid for s in export.offcpu} == {2201, 2202}
    only = select(export, pids=[2202])
    assert {s.process.pid for s in only.offcpu} == {2202}
    tasks = {s.task for s in export.offcpu}
    some = sorted(tasks)[0]
    assert {s.task for s in select(export, tasks=[some]).offcpu} == {some}


def test_an_analysed_sub_window_exports_the_blocked_time_of_its_intervals(tmp_path: Path) -> None:
    from profiler.capture.format import write_offcpu_timeline

    # GIVEN a ring-buffer capture with --off-cpu (six 5 s intervals): PID 2201's four stacks blocked in
    # intervals 0, 2, 3 and 5 by its timeline; PID 2202 without a timeline (a capture older than format 5)
    capture = tmp_path / "cap"
    write_capture(capture, "node1", {2201: spark_stacks(0)}, start=time.time() - 60, intervals=6, offcpu=ENTRIES)
    write_offcpu_timeline(capture, 2201, dict(zip((0, 2, 3, 5), ([e] for e in ENTRIES[2201]), strict=True)))
    analyze([capture], engine="in-process")
    assert sum(s.blocked_ns for s in load_export_set(capture).offcpu) == 3_751_250_000
    # WHEN analysed with --from 10 --to 20 (intervals 2 and 3)
    analyze([capture], engine="in-process", window=SubWindow(10.0, 20.0))
    export = load_export_set(capture)
    # THEN the export holds those intervals' blocked time, as the report draws it and summary.csv counts it,
    # and nothing of the PID without a timeline (not measured in a sub-window)
    assert export.window
    assert sorted((s.cause, s.blocked_ns) for s in export.offcpu) == [("lock", 1_250_000), ("monitor", 500_000_000)]
    assert {s.process.pid for s in export.offcpu} == {2201}
    profile = decode(render(export, "pprof"))  # type: ignore[arg-type]
    assert "off_cpu" in [profile.string_table[t.type] for t in profile.sample_type]


def test_the_reports_off_cpu_flamegraphs_link_to_the_exports_blocked_time(offcpu_capture: Path) -> None:
    from coordinator.report.render import render_report
    from tests.fixtures.report import read_payload

    # GIVEN a capture with --off-cpu, WHEN its report is rendered
    index = render_report(offcpu_capture)
    payload = read_payload(index)
    links = payload["exports"]
    assert isinstance(links, dict)
    offcpu_keys = {g["key"] for g in payload["graphs"] if g["key"].startswith("offcpu-")}  # type: ignore[attr-defined]
    # THEN every off-CPU graph has its links, to the off-CPU profile and pprof's off_cpu sample type
    assert offcpu_keys and offcpu_keys <= set(links["graphs"])
    pid = links["graphs"]["offcpu-pid:node1:2201"]
    assert pid["speedscope"] == "profile “node1 PID 2201 (spark executor) off-CPU”"
    assert pid["pprof"].startswith("go tool pprof -sample_index=off_cpu -tagfocus=process=^node1:2201$ -http=: ")
    task = next(k for k in offcpu_keys if k.startswith("offcpu-task:"))
    assert "-sample_index=off_cpu -tagfocus=task=" in links["graphs"][task]["pprof"]
    assert links["graphs"][task]["speedscope"].endswith("in each off-CPU profile")
    # AND the files beside the page carry that blocked time: the speedscope file has those profiles
    document = json.loads((index.parent / links["files"]["speedscope"]).read_text("utf-8"))
    assert "node1 PID 2201 (spark executor) off-CPU" in {p["name"] for p in document["profiles"]}
