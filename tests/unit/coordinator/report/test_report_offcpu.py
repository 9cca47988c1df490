"""The report's off-CPU view (docs/offcpu.md): blocked seconds per task and cause beside the on-CPU
seconds, off-CPU flamegraphs per PID and task (width: ms blocked), hostile names kept as text."""

from __future__ import annotations

import time
from pathlib import Path

from coordinator.report.offcpuview import OFFCPU_UNIT, blocked_counts, offcpu_table
from coordinator.report.render import render_report
from profiler.capture.offcpu import OffCpuEntry
from tests.fixtures.report import HOSTILE_FRAMES, read_payload, spark_stacks, write_capture

COLORS = {"Kafka": "#111", "GC": "#222", "unmatched": "#999"}
TASKS = ("Kafka", "GC", "unmatched")


def _row(host: str, pid: str, task: str, cpu: str, off: str, lock: str = "", net: str = "") -> dict[str, str]:
    return {"host": host, "pid": pid, "task": task, "cpu_seconds": cpu, "offcpu_seconds": off,
            "offcpu_lock_seconds": lock, "offcpu_net_seconds": net}


def test_table_sums_the_pid_rows_per_task_and_shows_only_the_causes_that_occurred() -> None:
    rows = [
        _row("h", "1", "Kafka", "2.5", "4.0", lock="1.0", net="3.0"),
        _row("h", "2", "Kafka", "1.5", "2.0", lock="2.0", net="0"),
        _row("h", "1", "GC", "0.5", "0", lock="0", net="0"),
        _row("h", "1", "*", "4.5", "6.0", lock="3.0", net="3.0"),  # a PID's total row: not a task
        _row("h", "*", "Kafka", "9", "9", lock="9", net="9"),  # a host row: not the cluster's
    ]
    table = offcpu_table(rows, TASKS, COLORS)
    assert table.shown and table.source == "the PID rows"
    assert table.causes == ("lock", "net")
    kafka, gc = table.lines
    assert (kafka.task, kafka.cpu_seconds, kafka.offcpu_seconds, kafka.by_cause) == ("Kafka", 4.0, 6.0, (3.0, 3.0))
    assert (gc.task, gc.offcpu_seconds, gc.color) == ("GC", 0.0, "#222")


def test_table_prefers_the_cluster_rows_of_summary_csv() -> None:
    rows = [_row("h", "1", "Kafka", "1", "1", lock="1"), _row("*", "*", "Kafka", "3", "7", lock="2", net="5")]
    table = offcpu_table(rows, TASKS, COLORS)
    assert table.source.startswith("summary.csv")
    assert [(line.task, line.offcpu_seconds, line.by_cause) for line in table.lines] == [("Kafka", 7.0, (2.0, 5.0))]


def test_table_shows_the_distinct_threads_of_summary_csv_and_no_column_without_them() -> None:
    # GIVEN summary.csv's cluster rows with the tasks' distinct blocked threads
    rows = [
        {**_row("*", "*", "Kafka", "3", "7", lock="2", net="5"), "offcpu_threads": "4"},
        {**_row("*", "*", "GC", "1", "1", lock="1"), "offcpu_threads": "2"},
    ]
    table = offcpu_table(rows, TASKS, COLORS)
    # THEN each line carries its count and the table shows the column
    assert table.with_threads
    assert [(line.task, line.threads) for line in table.lines] == [("Kafka", 4.0), ("GC", 2.0)]
    # AND rows that did not count them (a host's result.csv, an older capture) show no such column
    older = offcpu_table([_row("*", "*", "Kafka", "3", "7", lock="2", net="5")], TASKS, COLORS)
    assert older.shown and not older.with_threads and older.lines[0].threads is None


def test_a_run_without_off_cpu_shows_no_table() -> None:
    rows = [_row("h", "1", "Kafka", "2.5", ""), _row("*", "*", "Kafka", "3", "")]
    assert not offcpu_table(rows, TASKS, COLORS).shown
    assert not offcpu_table([], TASKS, COLORS).shown


def test_flamegraph_counts_are_milliseconds_blocked_per_stack_over_all_causes() -> None:
    entries = [
        OffCpuEntry("lock", "t;a;futex_wait_[k]", 2_400_000, 3),
        OffCpuEntry("preempted", "t;a;futex_wait_[k]", 1_200_000, 1),
        OffCpuEntry("net", "t;b", 400_000, 1),  # rounds to 0 ms: not drawn
    ]
    assert blocked_counts(entries) == {"t;a;futex_wait_[k]": 4}


def test_report_shows_off_cpu_per_task_and_its_flamegraphs_with_hostile_names_as_text(tmp_path: Path) -> None:
    # GIVEN a host capture of a run with --off-cpu whose blocked stacks carry hostile frames
    hostile_thread = "<img src=x onerror=window.__pwned=9>"
    entries = [
        OffCpuEntry("net", f"{hostile_thread};org/apache/kafka/Poll.run;ep_poll_[k]", 3_000_000_000, 40),
        OffCpuEntry("monitor", f"Executor;KafkaDataConsumer.get;{HOSTILE_FRAMES[0]};futex_wait_[k]", 500_000_000, 9),
        OffCpuEntry("safepoint", "GC Thread#0;SafepointSynchronize::block", 250_000_000, 30),
    ]
    capture = tmp_path / "cap"
    write_capture(capture, "node1", {2201: spark_stacks(0)}, start=time.time() - 60, offcpu={2201: entries})
    # WHEN the report is rendered
    index = render_report(capture, tmp_path / "report")
    html = index.read_text(encoding="utf-8")
    # THEN the off-CPU table has the tasks' blocked seconds by cause beside their on-CPU seconds
    assert '<section id="offcpu"' in html
    section = html[html.index('<section id="offcpu"') : html.index("</section>", html.index('<section id="offcpu"'))]
    for header in ("on-CPU s", "off-CPU s", "monitor s", "net s", "safepoint s"):
        assert header in section
    assert "lock s" not in section  # no task was blocked on a plain lock
    assert 'data-graph="offcpu-task:Kafka"' in section
    # AND flamegraphs per PID and per task, their width in milliseconds blocked
    payload = read_payload(index)
    graphs = {g["key"]: g for g in payload["graphs"]}  # type: ignore[attr-defined]
    assert graphs["offcpu-pid:node1:2201"]["samples"] == 3750 and graphs["offcpu-pid:node1:2201"]["unit"] == OFFCPU_UNIT
    assert graphs["offcpu-task:Kafka"]["samples"] == 3500 and graphs["offcpu-task:GC"]["samples"] == 250
    assert graphs["host:node1"]["unit"] == "samples"
    # AND no hostile name became markup
    assert "<img src=x" not in html and HOSTILE_FRAMES[0] not in html


def test_report_of_a_run_without_off_cpu_has_no_off_cpu_section(tmp_path: Path) -> None:
    capture = tmp_path / "cap"
    write_capture(capture, "node1", {2201: spark_stacks(0)}, start=time.time() - 60)
    html = render_report(capture, tmp_path / "report").read_text(encoding="utf-8")
    assert 'id="offcpu"' not in html
    assert not any(g["key"].startswith("offcpu") for g in read_payload(tmp_path / "report" / "index.html")["graphs"])  # type: ignore[attr-defined]
