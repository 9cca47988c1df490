"""The report's off-CPU view (docs/offcpu.md): blocked seconds per task and cause beside the on-CPU
seconds, off-CPU flamegraphs per PID and task (width: ms blocked), hostile names kept as text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.report.flame import StackClassifications
from coordinator.report.offcpuview import (
    NO_SITE,
    OFFCPU_UNIT,
    SITE_CHARS,
    THREAD_NAME_SITE,
    WHOLE_WINDOW_SITE,
    WaitSite,
    blocked_counts,
    offcpu_table,
    short_frame,
    wait_sites,
)
from coordinator.report.render import render_report
from profiler.capture.offcpu import OffCpuEntry
from tests.fixtures.flink_report import use_tree_templates
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


# A profile whose tasks are methods of the work and whose waiting task names only how threads wait
# (docs/offcpu.md, Reading blocked time per task): the shape of the shipped YSB profiles.
SITE_PROFILE = """
Kafka: org.apache.kafka.clients.consumer
Sink: RespConnection
Other: re:^Executor task
Wait [waiting]: jdk.internal.misc.Unsafe::park, pthread_cond_timedwait
GC: GC Thread
"""
SITE_TASKS = ("Kafka", "Sink", "Other", "Wait", "GC", "unmatched")
POLL = ("Executor task launch worker;java.lang.Thread::run;"
        "org.apache.kafka.clients.consumer.KafkaConsumer::poll [i];"
        "org.apache.kafka.clients.consumer.internals.ConsumerNetworkClient::poll;"
        "jdk.internal.misc.Unsafe::park;pthread_cond_timedwait;futex_wait_[k]")


def _classifications(profile: str = SITE_PROFILE) -> StackClassifications:
    from profiler.matching.appprofile import parse_profile
    from profiler.matching.matcher import Matcher

    return StackClassifications(Matcher(parse_profile(profile)), SITE_TASKS, off_cpu=True)


def test_short_frame_keeps_a_java_methods_class_and_name_and_drops_native_arguments() -> None:
    assert short_frame("org.apache.kafka.clients.consumer.KafkaConsumer::poll [i]") == "KafkaConsumer::poll"
    assert short_frame("com.example.WaitSplit$Worker::waitSocket [inlined]") == "WaitSplit$Worker::waitSocket"
    assert short_frame("ObjectMonitor::EnterI(JavaThread*)") == "ObjectMonitor::EnterI"
    assert short_frame("os::PlatformEvent::park(long)") == "os::PlatformEvent::park"
    assert short_frame("pthread_cond_timedwait") == "pthread_cond_timedwait"
    assert len(short_frame("x" * 5000)) == SITE_CHARS  # a target's text, bounded


def test_wait_sites_name_the_method_of_the_task_that_waited_per_cause_largest_first() -> None:
    # GIVEN one executor thread's blocked stacks: a Kafka poll parked (twice, in two PIDs), the sink's
    # round trip on the network, the task runner's own park, a GC thread's futex and a stack no task names
    sink = ("Executor task launch worker;java.lang.Thread::run;org.example.RespConnection::roundTrip;"
            "sun.nio.ch.NioSocketImpl::read;read;tcp_recvmsg_[k]")
    runner = "Executor task launch worker;java.lang.Thread::run;jdk.internal.misc.Unsafe::park;futex_wait_[k]"
    offcpu = {
        "h1": {1: [OffCpuEntry("park", POLL, 3_000_000_000, 30), OffCpuEntry("net", sink, 2_000_000_000, 20),
                   OffCpuEntry("park", runner, 5_000_000_000, 5), OffCpuEntry("preempted", POLL, 500_000_000, 9)]},
        "h2": {2: [OffCpuEntry("park", POLL, 1_000_000_000, 10),
                   OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 4_000_000_000, 40),
                   OffCpuEntry("sleep", "pool-1;java.lang.Thread::sleep;nanosleep_[k]", 700_000_000, 7)]},
    }
    # WHEN the report's model takes the wait sites
    sites = wait_sites(offcpu, _classifications())
    # THEN the Kafka poll's park is Kafka's, at the consumer's innermost method above the JDK's wait
    # frames, summed over hosts, before its smaller preempted part
    assert sites["Kafka"] == (WaitSite("park", "ConsumerNetworkClient::poll", pytest.approx(4.0)),
                              WaitSite("preempted", "ConsumerNetworkClient::poll", pytest.approx(0.5)))
    assert sites["Sink"] == (WaitSite("net", "RespConnection::roundTrip", pytest.approx(2.0)),)
    # AND a park with no method of a task above it goes to the task its thread's name says, not to Wait,
    # named by the method that called the wait
    assert sites["Other"] == (WaitSite("park", f"{THREAD_NAME_SITE} in Thread::run", pytest.approx(5.0)),)
    assert sites["GC"] == (WaitSite("lock", THREAD_NAME_SITE, pytest.approx(4.0)),)
    assert "Wait" not in sites
    assert sites["unmatched"] == (WaitSite("sleep", NO_SITE, pytest.approx(0.7)),)
    # AND only the largest sites are kept
    assert len(wait_sites(offcpu, _classifications(), limit=1)["Kafka"]) == 1


def test_a_stack_where_only_wait_frames_match_stays_with_the_waiting_task_at_its_wait_frame() -> None:
    idle = "pool-3-thread-1;java.lang.Thread::run;jdk.internal.misc.Unsafe::park;futex_wait_[k]"
    sites = wait_sites({"h": {1: [OffCpuEntry("park", idle, 2_000_000_000, 2)]}}, _classifications())
    assert sites == {"Wait": (WaitSite("park", "Unsafe::park", pytest.approx(2.0)),)}


def test_table_lines_carry_their_tasks_sites_and_say_when_there_are_none() -> None:
    rows = [_row("*", "*", "Kafka", "3", "4", net="4"), _row("*", "*", "GC", "1", "1", lock="1")]
    site = WaitSite("net", "KafkaConsumer::poll", 4.0)
    table = offcpu_table(rows, TASKS, COLORS, {"Kafka": (site,)})
    assert table.with_sites
    assert [(line.task, line.sites) for line in table.lines] == [("Kafka", (site,)), ("GC", ())]
    assert not offcpu_table(rows, TASKS, COLORS).with_sites


def test_report_names_where_each_task_waited_with_hostile_frames_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_tree_templates(monkeypatch)  # this tree's template, not an installed copy's
    # GIVEN a capture with --off-cpu whose Kafka stack waited in a method with a hostile name
    hostile_method = "org/apache/kafka/<img src=x onerror=window.__pwned=7>::poll"
    entries = [
        OffCpuEntry("net", f"Executor;{hostile_method};jdk.internal.misc.Unsafe::park;ep_poll_[k]", 3_000_000_000, 40),
        OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 1_000_000_000, 9),
    ]
    capture = tmp_path / "cap"
    write_capture(capture, "node1", {2201: spark_stacks(0)}, start=time.time() - 60, offcpu={2201: entries})
    # WHEN the report is rendered
    html = render_report(capture, tmp_path / "report").read_text(encoding="utf-8")
    section = html[html.index('<section id="offcpu"') : html.index("</section>", html.index('<section id="offcpu"'))]
    # THEN the table says where each task waited, per cause, with the method's name as text
    assert "where it waited" in section
    assert "net 3 s <code>org/apache/kafka/&lt;img src=x onerror=window.__pwned=7&gt;::poll</code>" in section
    assert f"lock 1 s <code>{THREAD_NAME_SITE}</code>" in section
    assert "<img src=x" not in html


def test_a_thread_blocked_all_window_is_named_as_such_and_a_kernel_frame_without_its_mark() -> None:
    # GIVEN a pool thread read from /proc (never switched in the window) and a thread no task's frame names
    # but the waiting task's pattern on a kernel frame (the on-CPU rule then decides)
    idle = "GC Thread#3;[blocked all window];futex_wait_[k]"
    service = "Notification Thread;[blocked all window];__futex_abstimed_wait_common;futex_wait_[k]"
    profile = SITE_PROFILE.replace("pthread_cond_timedwait", "futex_wait")
    sites = wait_sites({"h": {1: [OffCpuEntry("lock", idle, 20_000_000_000, 1),
                                  OffCpuEntry("lock", service, 20_000_000_000, 1)]}}, _classifications(profile))
    # THEN the first reads as its thread's name, blocked all window; the second as the kernel's wait
    assert sites["GC"] == (WaitSite("lock", WHOLE_WINDOW_SITE, pytest.approx(20.0)),)
    assert sites["Wait"] == (WaitSite("lock", "futex_wait", pytest.approx(20.0)),)
    assert short_frame("__futex_wait_[k]") == "__futex_wait"
