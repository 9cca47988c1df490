"""The report's Flink section: Flink's own busy/back-pressured/idle per vertex beside the sampled on-CPU
time, and the events note with the count's uncertainty (rendered with this tree's templates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.analysis.load import load_run_stacks
from coordinator.report import render
from profiler.capture.format import write_offcpu
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import read_pid_offcpu
from tests.fixtures.flink_report import SOURCE, WINDOW, flink_run_dir, use_tree_templates
from tests.fixtures.report import make_run_dir


@pytest.fixture
def tree_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    use_tree_templates(monkeypatch)


def off_cpu_flink_run_dir(root: Path) -> tuple[Path, Path]:
    """A Flink run directory (tests/fixtures/flink_report.py) recorded with --off-cpu, and its one capture."""
    run_dir = flink_run_dir(root)
    capture_dir = run_dir / "hosts" / "node1"
    meta = json.loads((capture_dir / "meta.json").read_text())
    meta["off_cpu_min_block_ms"] = 1.0
    (capture_dir / "meta.json").write_text(json.dumps(meta))
    return run_dir, capture_dir


def test_flink_vertices_show_flinks_times_beside_the_sampled_on_cpu_time(tmp_path: Path, tree_templates: None) -> None:
    # GIVEN a run with flink.json; WHEN its report is rendered
    index = render.render_report(flink_run_dir(tmp_path / "runs"))
    page = index.read_text(encoding="utf-8")
    # THEN the Flink section lists both vertices, source first, with busy beside on-CPU per subtask
    assert "Flink&#39;s own view beside the samples" in page or "Flink's own view beside the samples" in page
    assert page.index(SOURCE.replace(">", "&gt;")) < page.index(WINDOW.replace(">", "&gt;"))
    run = render.load_run(index.parent.parent)
    view = render.build_view(run, load_run_stacks(run))
    lines = {line.name: line for line in view.flink_vertices}
    assert lines[SOURCE].on_cpu_ms_per_s == pytest.approx(150.0) and lines[SOURCE].samples == 891
    assert lines[WINDOW].on_cpu_ms_per_s == pytest.approx(50.0)
    assert lines[WINDOW].busy_off_cpu_ms_per_s == pytest.approx(350.0)  # busy 400, on CPU 50: waiting
    assert lines[SOURCE].records_in == 600_000 and lines[SOURCE].records_in_uncertainty == 1200.0
    # AND the events note (summary.csv's count, 300,000 in the fixture) carries the uncertainty and the method
    assert "300,000 events processed in the window (from flink-rest:http://127.0.0.1:8081) ± 1,200, 0.40 %, "\
        "interpolated between metric-cache refreshes" in view.events_note


def test_no_flink_section_without_flink_json(tmp_path: Path, tree_templates: None) -> None:
    index = render.render_report(make_run_dir(tmp_path / "runs", hostile=False))
    assert 'id="flink"' not in index.read_text(encoding="utf-8")


def test_health_says_when_subtasks_are_not_mapped_to_taskmanagers(tmp_path: Path, tree_templates: None) -> None:
    # GIVEN a Flink run whose flink.json has no placement (REST gone at the end), and one that has it
    from tests.fixtures.flink_report import flink_vertex_run_dir

    for run_dir, expected in ((flink_run_dir(tmp_path / "a"), "warn"), (flink_vertex_run_dir(tmp_path / "b"), "ok")):
        run = render.load_run(run_dir)
        view = render.build_view(run, load_run_stacks(run))
        # THEN a health line says whether the mapping to TaskManager ids is there
        (line,) = [h for h in view.health if h.topic.endswith("Flink subtasks")]
        assert line.level == expected, line
        if expected == "warn":
            assert "mapping of subtasks to TaskManager ids is missing" in line.text
            assert view.flink_run and not view.subtask_lines  # the section says how to get vertex rows
        else:
            assert "1 of them sampled on this host" in line.text and len(view.subtask_lines) == 4


def test_with_off_cpu_each_vertex_gets_its_task_threads_blocked_time_by_cause(
    tmp_path: Path, tree_templates: None
) -> None:
    # GIVEN a Flink run with --off-cpu (30 s, parallelism 2): the source's task threads (kernel comm
    # "Source: GenSour") blocked 6 s parked and 3 s on the network, a GC thread 9 s; the window's threads
    # (comm "WindowSum -> Di") never blocked long enough, and a thread named like no vertex 5 s
    run_dir, capture_dir = off_cpu_flink_run_dir(tmp_path / "runs")
    write_offcpu(capture_dir, 2201, [
        OffCpuEntry("park", "Source: GenSour;jdk.internal.misc.Unsafe::park;futex_wait_[k]", 4_000_000_000, 40),
        OffCpuEntry("park", "Source: GenSour;[blocked all window];futex_wait_[k]", 2_000_000_000, 1),
        OffCpuEntry("net", "Source: GenSour;sun.nio.ch.SocketDispatcher::read0;tcp_recvmsg_[k]", 3_000_000_000, 30),
        OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 9_000_000_000, 90),
        OffCpuEntry("sleep", "Source: GenOthe;JVM_Sleep", 5_000_000_000, 5),
    ])
    # WHEN its report is built and rendered
    index = render.render_report(run_dir)
    run = render.load_run(run_dir)
    stacks = load_run_stacks(run)
    offcpu = {"node1": {2201: read_pid_offcpu(capture_dir, 2201) or []}}
    lines = {line.name: line for line in render.build_view(run, stacks, offcpu=offcpu).flink_vertices}
    # THEN the source's blocked time per subtask and second is split by cause (6 s / 30 s / 2 = 100 ms/s)
    assert lines[SOURCE].off_cpu_by_cause == (("park", pytest.approx(100.0)), ("net", pytest.approx(50.0)))
    # AND the window, whose threads were never seen blocked, is "not measured", not zero
    assert lines[WINDOW].off_cpu_by_cause == ()
    page = index.read_text(encoding="utf-8")
    assert "blocked, by cause" in page and "park 100 · net 50" in page and "not measured" in page
    # AND a run without --off-cpu has no such column
    plain_dir = flink_run_dir(tmp_path / "plain")
    plain = render.build_view(render.load_run(plain_dir), stacks, offcpu=offcpu)
    assert all(line.off_cpu_by_cause is None for line in plain.flink_vertices)
    assert "blocked, by cause" not in render.render_report(plain_dir).read_text(encoding="utf-8")


def test_with_off_cpu_each_vertex_gets_its_blocked_time_by_profile_task_and_cause(
    tmp_path: Path, tree_templates: None
) -> None:
    # GIVEN a Flink run with --off-cpu (30 s, parallelism 2) whose source threads waited 6 s in a Kafka
    # consumer's poll (parked above the JDK's wait frames), 3 s reading a socket in their JSON parser's
    # caller, and 1.5 s parked with no method of a task above the wait (the thread's own loop)
    run_dir, capture_dir = off_cpu_flink_run_dir(tmp_path / "runs")
    poll = "Source: GenSour;org/apache/kafka/Consumer.poll;jdk.internal.misc.Unsafe::park;futex_wait_[k]"
    parse = "Source: GenSour;JsonParser.next;sun.nio.ch.NioSocketImpl::read;tcp_recvmsg_[k]"
    loop = "Source: GenSour;java.lang.Thread::run;jdk.internal.misc.Unsafe::park;futex_wait_[k]"
    write_offcpu(capture_dir, 2201, [
        OffCpuEntry("park", poll, 6_000_000_000, 60),
        OffCpuEntry("net", parse, 3_000_000_000, 30),
        OffCpuEntry("park", loop, 1_500_000_000, 15),
        OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 9_000_000_000, 90),  # no vertex's thread
    ])
    # WHEN its report is built
    run = render.load_run(run_dir)
    offcpu = {"node1": {2201: read_pid_offcpu(capture_dir, 2201) or []}}
    lines = {line.name: line for line in render.build_view(run, load_run_stacks(run), offcpu=offcpu).flink_vertices}
    # THEN the source's blocked ms per second of one subtask are split by the task whose method waited,
    # most blocked first (6 s / 30 s / 2 = 100 ms/s), the thread's own loop by its name (unmatched here)
    assert lines[SOURCE].off_cpu_by_task == (
        ("Kafka", (("park", pytest.approx(100.0)),)),
        ("Deserialize", (("net", pytest.approx(50.0)),)),
        ("unmatched", (("park", pytest.approx(25.0)),)),
    )
    # AND the cause-only column is the same time, and the window (never seen blocked) is not measured
    assert lines[SOURCE].off_cpu_by_cause == (("park", pytest.approx(125.0)), ("net", pytest.approx(50.0)))
    assert lines[WINDOW].off_cpu_by_task == ()
    page = render.render_report(run_dir).read_text(encoding="utf-8")
    assert "blocked, by task" in page and "Kafka: park 100</span>" in page and "Deserialize: net 50" in page
