"""``coordinator analyze --from/--to``: summary rows of a sub-window from the capture's timeline, on
the in-process engine (tests/integration/test_pipeline.py checks Spark writes the same bytes)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze
from coordinator.analysis.timeline import SubWindow
from coordinator.cli import main as coordinator_main
from tests.fixtures.captures import (
    TIMELINE_OPTIONS,
    PidSpec,
    timeline_hosts,
    write_run_dir,
)
from tests.fixtures.exports import analysed_task_files


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _row(rows: list[dict[str, str]], host: str, pid: str, task: str) -> dict[str, str]:
    (row,) = [r for r in rows if r["host"] == host and r["pid"] == pid and r["task"] == task]
    return row


def _analyze(run_dir: Path, out: Path, *window: str) -> int:
    return coordinator_main(["analyze", str(run_dir), "--engine", "in-process", "--out", str(out), *window])


def test_sub_window_rows_equal_a_hand_computation(
    timeline_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # WHEN the second interval alone is analysed
    assert _analyze(timeline_run, tmp_path / "out", "--from", "10", "--to", "20") == 0
    rows = _rows(tmp_path / "out" / "summary.csv")

    # THEN PID 100 has that interval's stacks (Kafka 20, Deserialize 30) and its counters timeline row
    kafka, deser = _row(rows, "h1", "100", "Kafka"), _row(rows, "h1", "100", "Deserialize")
    assert (kafka["samples"], deser["samples"], _row(rows, "h1", "100", "GC")["samples"]) == ("20", "30", "0")
    assert float(kafka["cycles"]) == pytest.approx(20 / 50 * 2.0e9)
    assert float(deser["cpu_seconds"]) == pytest.approx(30 / 50 * 1.0)
    total_100 = _row(rows, "h1", "100", "*")
    assert (total_100["samples"], total_100["cycles"], total_100["instructions"]) == ("50", "2000000000", "4000000000")
    assert float(total_100["ipc"]) == pytest.approx(2.0)
    # PID 200 has no counters timeline: window totals × 30 of its 100 samples
    total_200 = _row(rows, "h1", "200", "*")
    assert (total_200["samples"], float(total_200["cycles"]), float(total_200["cpu_seconds"])) == (
        "30", pytest.approx(3.0e8), pytest.approx(0.15)
    )
    # host and cluster rows add up the PIDs; engine totals (events) and stall events are not per interval
    host_kafka = _row(rows, "h1", "*", "Kafka")
    assert host_kafka["samples"] == "50" and float(host_kafka["cycles"]) == pytest.approx(8.0e8 + 3.0e8)
    assert float(host_kafka["share"]) == pytest.approx(50 / 80)
    assert _row(rows, "*", "*", "*")["samples"] == "80"
    assert {r["events"] for r in rows} == {""} and {r["stalled_cycles_frontend"] for r in rows} == {""}

    # analysis.json and the command's output say which intervals were used and how counters were cut
    window = json.loads((tmp_path / "out" / "analysis.json").read_text())["window"]
    assert window["from"] == 10 and window["to"] == 20
    (host,) = window["hosts"]
    assert (host["host"], host["first_interval"], host["last_interval"], host["from"], host["to"]) == (
        "h1", 1, 1, 10.0, 20.0
    )
    assert host["counters"] == {
        "50": "not measured",
        "100": "counters timeline",
        "200": "scaled by sample fraction",
    }
    printed = capsys.readouterr().out
    assert "timed h1: sub-window 10–20 s (intervals 1–1 of 10 s)" in printed
    assert "PID 200: no counters timeline, cycles and CPU seconds scaled by sample fraction" in printed
    assert "--from 10 --to 20" in printed  # the re-analyse hint keeps the window


def test_sub_window_is_whole_intervals(timeline_run: Path, tmp_path: Path) -> None:
    # --from 12 --to 25 overlaps intervals 1 and 2: the effective sub-window is 10–30 s
    analyze([timeline_run], out_dir=tmp_path / "out", engine="in-process", window=SubWindow(12, 25))
    (host,) = json.loads((tmp_path / "out" / "analysis.json").read_text())["window"]["hosts"]
    assert (host["first_interval"], host["last_interval"], host["from"], host["to"]) == (1, 2, 10.0, 30.0)
    rows = _rows(tmp_path / "out" / "summary.csv")
    assert _row(rows, "h1", "100", "Deserialize")["samples"] == "70"
    assert _row(rows, "h1", "100", "unmatched")["samples"] == "10"
    assert float(_row(rows, "h1", "100", "*")["cycles"]) == pytest.approx(5.0e9)
    # only --to: from the start
    analyze([timeline_run], out_dir=tmp_path / "to", engine="in-process", window=SubWindow(None, 10))
    assert _row(_rows(tmp_path / "to" / "summary.csv"), "h1", "100", "GC")["samples"] == "10"
    # the task stacks are the sub-window's only
    assert analysed_task_files(tmp_path / "to")["GC.folded"].endswith(" 10\n")


def test_full_range_equals_no_range(timeline_run: Path, tmp_path: Path) -> None:
    assert _analyze(timeline_run, tmp_path / "none") == 0
    assert _analyze(timeline_run, tmp_path / "full", "--from", "0", "--to", "30") == 0
    assert _analyze(timeline_run, tmp_path / "open", "--from", "0") == 0
    for name in ("summary.csv", "unmatched.folded"):
        expected = (tmp_path / "none" / name).read_bytes()
        assert (tmp_path / "full" / name).read_bytes() == expected, name
        assert (tmp_path / "open" / name).read_bytes() == expected, name
    tasks = analysed_task_files(tmp_path / "none")
    assert tasks["Kafka.folded"] and tasks["GC.folded"]
    assert analysed_task_files(tmp_path / "full") == tasks == analysed_task_files(tmp_path / "open")
    # counters.json (6.1e9 cycles), not the timeline's sum (6.0e9), and the events stay
    rows = _rows(tmp_path / "full" / "summary.csv")
    assert _row(rows, "h1", "100", "*")["cycles"] == "6100000000" and _row(rows, "*", "*", "*")["events"] == "3000"
    assert json.loads((tmp_path / "none" / "analysis.json").read_text())["window"] is None
    (host,) = json.loads((tmp_path / "full" / "analysis.json").read_text())["window"]["hosts"]
    assert host["whole_window"] is True and host["counters"]["100"] == "window totals"


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"format_version": 1}, "format_version 1 capture, which has no timeline"),
        ({"stack_collection": "stackmap"}, "stack_collection 'stackmap' keeps no sample timestamps"),
    ],
)
def test_capture_without_timeline_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, object], why: str
) -> None:
    # GIVEN a healthy v2 run and a second run whose capture has no timeline
    good = write_run_dir(tmp_path / "good", "good", timeline_hosts(), **{**TIMELINE_OPTIONS})
    old = write_run_dir(
        tmp_path / "old", "old", {"h9": [PidSpec(7, {"main;work": 5}, cycles=1.0)]}, **{**TIMELINE_OPTIONS, **options}
    )
    # WHEN both are analysed with --from
    code = coordinator_main(
        ["analyze", str(good), str(old), "--engine", "in-process", "--out", str(tmp_path / "out"), "--from", "5"]
    )
    # THEN one line names the capture and why, with the exit code of bad input, and nothing is written
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(old / "hosts" / "h9") in err and why in err and "without them" in err
    assert not (tmp_path / "out").exists()
    # without --from/--to the same capture analyses as before
    assert _analyze(old, tmp_path / "plain") == 0


def test_window_arguments_are_validated(timeline_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--from", "-1"], ["--to", "nan"], ["--from", "ten"]):
        with pytest.raises(SystemExit) as exited:
            _analyze(timeline_run, tmp_path / "out", *bad)
        assert exited.value.code == 2
        assert "seconds into the window" in capsys.readouterr().err
    assert _analyze(timeline_run, tmp_path / "out", "--from", "20", "--to", "10") == 2
    assert "--from 20 is not before --to 10" in capsys.readouterr().err
    assert _analyze(timeline_run, tmp_path / "out", "--from", "30") == 2
    assert "at or past the end of its 30.0 s window" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_timeline_without_counters_timeline_for_the_whole_host(tmp_path: Path) -> None:
    # GIVEN a PID without samples in the sub-window and without counters timeline
    idle = PidSpec(300, timeline={0: {"main;work": 4}}, cycles=5.0e8, cpu_seconds=0.25)
    run_dir = write_run_dir(tmp_path / "r", "r", {"h": [idle]}, **TIMELINE_OPTIONS)
    analyze([run_dir], out_dir=tmp_path / "out", engine="in-process", window=SubWindow(10, None))
    total = _row(_rows(tmp_path / "out" / "summary.csv"), "h", "300", "*")
    # its share of the window's samples is 0, so are its sub-window counters
    assert (total["samples"], total["cycles"], total["cpu_seconds"]) == ("0", "0", "0")


def test_sub_window_cuts_off_cpu_time_from_its_timeline(timeline_run: Path, tmp_path: Path) -> None:
    from profiler.capture import format as capture
    from profiler.capture.offcpu import OffCpuEntry, merge_entries

    # GIVEN PID 100 blocked polling Kafka 1 s, 2 s and 4 s in the three intervals and 0.5 s in a GC thread in
    # the second; PID 200 has offcpu.folded but no timeline (a capture older than format 5)
    host = timeline_run / "hosts" / "h1"
    poll = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;Unsafe::park;futex_wait_[k]"
    by_interval = {
        0: [OffCpuEntry("net", poll, 10**9, 10)],
        1: [OffCpuEntry("net", poll, 2 * 10**9, 20), OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 5 * 10**8, 1)],
        2: [OffCpuEntry("net", poll, 4 * 10**9, 40)],
    }
    capture.write_offcpu(host, 100, merge_entries(e for es in by_interval.values() for e in es))
    capture.write_offcpu_timeline(host, 100, by_interval)
    capture.write_offcpu(host, 200, [OffCpuEntry("net", poll, 10**9, 1)])
    # WHEN the second interval alone is analysed, and the whole window
    assert _analyze(timeline_run, tmp_path / "cut", "--from", "10", "--to", "20") == 0
    assert _analyze(timeline_run, tmp_path / "whole") == 0
    cut, whole = _rows(tmp_path / "cut" / "summary.csv"), _rows(tmp_path / "whole" / "summary.csv")
    # THEN the cut holds that interval's blocked time per task and cause, the whole window all of it
    assert float(_row(cut, "h1", "100", "Kafka")["offcpu_net_seconds"]) == 2.0
    assert float(_row(cut, "h1", "100", "GC")["offcpu_lock_seconds"]) == 0.5
    assert float(_row(cut, "h1", "100", "*")["offcpu_seconds"]) == 2.5
    assert float(_row(whole, "h1", "100", "Kafka")["offcpu_net_seconds"]) == 7.0
    # AND a PID without a timeline is "not measured" in the cut, measured in the whole window
    assert _row(cut, "h1", "200", "*")["offcpu_seconds"] == ""
    assert float(_row(whole, "h1", "200", "*")["offcpu_seconds"]) == 1.0


def test_sub_window_counts_the_threads_blocked_in_its_intervals(timeline_run: Path, tmp_path: Path) -> None:
    from profiler.capture import format as capture
    from profiler.capture.offcpu import OffCpuEntry, merge_entries

    # GIVEN PID 100 whose threads 11 and 12 polled Kafka in interval 0, thread 12 alone in interval 1 (once
    # polling, once on a lock under Kafka), thread 13 in interval 2; PID 200 with a timeline but no thread sets
    host = timeline_run / "hosts" / "h1"
    poll = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;ep_poll_[k]"
    lock = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;futex_wait_[k]"
    by_interval = {
        0: [OffCpuEntry("net", poll, 10**9, 10, threads=frozenset({11, 12}))],
        1: [
            OffCpuEntry("net", poll, 10**9, 10, threads=frozenset({12})),
            OffCpuEntry("lock", lock, 10**9, 10, threads=frozenset({12})),
        ],
        2: [OffCpuEntry("net", poll, 10**9, 10, threads=frozenset({13}))],
    }
    capture.write_offcpu(host, 100, merge_entries(e for es in by_interval.values() for e in es))
    capture.write_offcpu_timeline(host, 100, by_interval)
    old = {1: [OffCpuEntry("net", poll, 10**9, 1)]}
    capture.write_offcpu(host, 200, old[1])
    capture.write_offcpu_timeline(host, 200, old)
    # WHEN the second and third intervals are analysed, and the whole window
    assert _analyze(timeline_run, tmp_path / "cut", "--from", "10", "--to", "30") == 0
    assert _analyze(timeline_run, tmp_path / "whole") == 0
    cut, whole = _rows(tmp_path / "cut" / "summary.csv"), _rows(tmp_path / "whole" / "summary.csv")
    # THEN the cut counts the threads blocked in its intervals, each once (12 under two stacks, in two intervals)
    assert _row(cut, "h1", "100", "Kafka")["offcpu_threads"] == "2"
    assert _row(whole, "h1", "100", "Kafka")["offcpu_threads"] == "3"
    assert float(_row(cut, "h1", "100", "Kafka")["wall_seconds_per_thread"]) == pytest.approx(
        float(_row(cut, "h1", "100", "Kafka")["wall_seconds"]) / 2, rel=1e-5
    )
    # AND a timeline without thread sets (a capture made before them) is "not measured", never 0
    assert _row(cut, "h1", "200", "Kafka")["offcpu_threads"] == ""
    assert _row(whole, "h1", "200", "Kafka")["offcpu_threads"] == ""


def test_report_loads_the_blocked_stacks_of_the_sub_windows_intervals(timeline_run: Path) -> None:
    from coordinator.analysis.load import load_offcpu
    from profiler.capture import format as capture
    from profiler.capture.offcpu import OffCpuEntry
    from profiler.capture.read import read_capture

    host = timeline_run / "hosts" / "h1"
    poll = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;futex_wait_[k]"
    by_interval = {0: [OffCpuEntry("net", poll, 1, 1)], 1: [OffCpuEntry("net", poll, 20, 2)],
                   2: [OffCpuEntry("net", poll, 300, 3)]}  # fmt: skip
    capture.write_offcpu(host, 100, [OffCpuEntry("net", poll, 321, 6)])
    capture.write_offcpu_timeline(host, 100, by_interval)
    capture.write_offcpu(host, 200, [OffCpuEntry("net", poll, 5, 1)])  # no timeline: left out of a cut
    problems: list[str] = []
    loaded = read_capture(host)
    whole = {100: [OffCpuEntry("net", poll, 321, 6)], 200: [OffCpuEntry("net", poll, 5, 1)]}
    assert load_offcpu(loaded, problems) == whole
    assert load_offcpu(loaded, problems, (1, 2)) == {100: [OffCpuEntry("net", poll, 320, 5)]}
    assert problems == []
