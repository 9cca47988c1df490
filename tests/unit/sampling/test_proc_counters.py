"""The /proc counters against a fake /proc tree: deltas from add_pid, threads tracked across readings,
hostile comms and files, vanished threads and processes, and which source ``auto`` chooses."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from profiler.errors import ConfigError
from profiler.sampling.counters import CounterGroup
from profiler.sampling.proc_counters import (
    CLOCK_TICKS_PER_S,
    ProcFiles,
    parse_migrations,
    parse_stat,
    parse_switches,
)
from profiler.sampling.taskstats import ThreadExit
from tests.fixtures.fakeproc import FakeProc, stat_line
from tests.fixtures.taskstats import ReplayExits
from tests.unit.sampling.test_counters import NO_PMU, FakePerf

SOFTWARE = ["task-clock", "context-switches", "cpu-migrations", "page-faults"]
TICK_NS = 1e9 / CLOCK_TICKS_PER_S


def proc_group(
    root: Path,
    events: list[str] | None = None,
    source: str = "proc",
    missing: dict[str, int] | None = None,
    exits: ReplayExits | None = None,
    threads_every_s: float = 0.0,
) -> CounterGroup:
    fake = FakePerf({}, missing=dict(NO_PMU) | (missing or {}))
    source_of_exits = exits if exits is not None else ReplayExits(unavailable="taskstats off in this test")
    return CounterGroup(
        events or SOFTWARE,
        syscalls=fake,
        nominal_hz=(1e9, "t"),
        source=source,
        proc_files=ProcFiles(str(root)),
        exit_source=lambda: source_of_exits,
        thread_readings_every_s=threads_every_s,
    )


@pytest.mark.parametrize("comm", ["java", "a b) S 1 2 3 (", ") 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9", "x)"])
def test_stat_fields_start_after_the_last_parenthesis(comm: str) -> None:
    totals = parse_stat(stat_line(42, comm, utime=7, stime=5, minflt=30, majflt=2, start=888))
    assert totals is not None
    assert (totals.cpu_ticks, totals.minor_faults, totals.major_faults, totals.start_ticks) == (12, 30, 2, 888)


@pytest.mark.parametrize(
    "text", ["", "42 (java S 1", "42 (java) S 1 2 3", stat_line(1, "j", 7, 5, 3, 1, 9).replace(" 7 5 ", " ² 5 ")]
)
def test_malformed_stat_is_none(text: str) -> None:
    assert parse_stat(text) is None


def test_status_and_sched_take_the_kernels_own_lines() -> None:
    # a comm imitating the kernel's lines comes first (Name:, the sched header): the last line wins
    status = "Name:\tvoluntary_ctxt_switches: 999\nvoluntary_ctxt_switches:\t4\nnonvoluntary_ctxt_switches:\t3\n"
    assert parse_switches(status) == 7
    assert parse_switches("voluntary_ctxt_switches:\t4\n") is None
    sched = "se.nr_migrations : 99 (1, #threads: 1)\n---\nse.nr_migrations   :   5\n"
    assert parse_migrations(sched) == 5
    assert parse_migrations("x (1, #threads: 1)\n---\nse.nr_migrations : -3\n") is None


def test_deltas_from_add_pid_with_threads_born_and_gone(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=100, stime=50, minflt=1000, majflt=10, comm="java) S 1")
    proc.thread(7, 7, voluntary=40, involuntary=10, migrations=5)
    proc.thread(7, 8, voluntary=100, involuntary=0, migrations=1)
    group = proc_group(tmp_path)
    group.add_pid(7)
    assert group.open_fds() == 0  # no perf event in any thread

    # GIVEN thread 8 runs on, a thread 9 is born and reaches 6 switches, then both are read
    proc.process(7, utime=130, stime=60, minflt=1500, majflt=12)
    proc.thread(7, 8, voluntary=110, involuntary=2, migrations=3)
    proc.thread(7, 9, voluntary=5, involuntary=1, migrations=2, start=1200)
    first = group.read(7)
    assert first.events["context-switches"].value == 12 + 6
    assert first.events["cpu-migrations"].value == 2 + 2
    assert first.cpu_seconds == pytest.approx(40 * TICK_NS / 1e9)
    assert first.events["page-faults"].value == 502

    # WHEN thread 8 exits (its last 5 switches unseen), thread 9 goes on, tid 8 is reused by a new thread
    proc.thread(7, 8, voluntary=115, involuntary=2)
    proc.end_thread(7, 8)
    proc.thread(7, 9, voluntary=9, involuntary=1, migrations=2, start=1200)
    proc.thread(7, 8, voluntary=3, involuntary=0, migrations=0, start=1500)
    proc.thread(7, 7, voluntary=41, involuntary=10, migrations=5)
    proc.process(7, utime=140, stime=60, minflt=1500, majflt=12)
    second = group.read(7)
    # THEN the gone thread keeps its last reading; the new tid 8 counts from zero
    assert second.events["context-switches"].value == 1 + 12 + 10 + 3
    assert second.events["task-clock"].value == pytest.approx(50 * TICK_NS)
    note = second.events["context-switches"].note
    assert "after its last reading before it exited are not counted" in note
    assert "clock ticks" in second.events["task-clock"].note
    task_clock = second.events["task-clock"]
    assert task_clock.supported and task_clock.running_ns == task_clock.enabled_ns and not task_clock.scaled
    assert second.cycles_estimated and second.cycles == pytest.approx(second.cpu_seconds * 1e9)  # type: ignore[operator]


def test_reaped_process_keeps_its_last_reading_and_says_so(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10, minflt=5)
    proc.thread(7, 7, voluntary=1)
    group = proc_group(tmp_path)
    group.add_pid(7)
    proc.process(7, utime=30, minflt=9)
    proc.thread(7, 7, voluntary=4)
    assert group.read(7).events["task-clock"].value == pytest.approx(20 * TICK_NS)
    proc.end_process(7)
    group.pid_exited(7)
    after = group.read(7)
    assert after.events["task-clock"].value == pytest.approx(20 * TICK_NS)
    assert after.events["context-switches"].value == 3 and after.events["page-faults"].value == 4
    assert "process exited: values as of its last reading" in after.events["task-clock"].note
    proc.process(7, utime=99)  # frozen: a later process with the same pid changes nothing
    assert group.read(7).events["task-clock"].value == pytest.approx(20 * TICK_NS)


def test_reused_pid_is_not_the_process_we_added(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10, start=1000)
    group = proc_group(tmp_path)
    group.add_pid(7)
    proc.process(7, utime=20, start=1000)
    assert group.read(7).events["task-clock"].value == pytest.approx(10 * TICK_NS)
    proc.process(7, utime=500, start=5000)  # another process got pid 7
    value = group.read(7).events["task-clock"]
    assert value.value == pytest.approx(10 * TICK_NS) and "process exited" in value.note


def test_process_gone_before_any_reading_is_not_measured_never_zero(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=3)
    group = proc_group(tmp_path)
    group.add_pid(7)
    proc.end_process(7)
    group.pid_exited(7)
    counters = group.read(7)
    for name in SOFTWARE:
        value = counters.events[name]
        assert value.value is None and not value.supported and "not measured" in value.note
    assert counters.cpu_seconds is None and counters.cycles is None


def test_vanished_before_add_and_missing_sched(tmp_path: Path) -> None:
    group = proc_group(tmp_path)
    group.add_pid(404)
    gone = group.read(404)
    assert all(gone.events[name].value is None and "exited before" in gone.events[name].note for name in SOFTWARE)
    proc = FakeProc(tmp_path)
    proc.process(8)
    proc.thread(8, 8, voluntary=1, migrations=None)  # a kernel without CONFIG_SCHED_DEBUG
    group.add_pid(8)
    migrations = group.read(8).events["cpu-migrations"]
    assert migrations.value is None and not migrations.supported and "CONFIG_SCHED_DEBUG" in migrations.note
    assert group.read(8).events["context-switches"].value == 0


def test_links_fifos_and_oversized_files_are_not_read(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text(stat_line(9, "root", 100, 100, 100, 100, 1000))
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "stat").symlink_to(secret)
    files = ProcFiles(str(tmp_path), max_bytes=4096)
    assert files.text("9/stat") is None and files.process(9) is None
    proc.process(10)
    os.mkfifo(tmp_path / "10" / "task" / "10")  # not a directory: no thread
    assert files.tasks(10) == [10] and files.thread(10, 10) is None
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "stat").write_text("11 (x) " + "1 " * 5000)
    assert files.text("11/stat") is None
    (tmp_path / "12").symlink_to(tmp_path / "10")
    assert files.tasks(12) is None and files.tasks(13) is None


def test_auto_uses_proc_without_a_pmu_and_perf_with_one(tmp_path: Path) -> None:
    FakeProc(tmp_path).process(7)
    no_pmu = proc_group(tmp_path, ["cycles", *SOFTWARE], source="auto")
    no_pmu.add_pid(7)
    assert no_pmu.proc_events == tuple(SOFTWARE)
    with_pmu = CounterGroup(
        ["cycles", *SOFTWARE], syscalls=FakePerf({7: [7]}), nominal_hz=(1e9, "t"), proc_files=ProcFiles(str(tmp_path))
    )
    with_pmu.add_pid(7)
    assert with_pmu.proc_events == () and with_pmu.open_fds() == 5
    forced = CounterGroup(
        ["cycles", *SOFTWARE],
        syscalls=FakePerf({7: [7]}),
        nominal_hz=(1e9, "t"),
        source="proc",
        proc_files=ProcFiles(str(tmp_path)),
        exit_source=ReplayExits,
    )
    forced.add_pid(7)
    assert forced.proc_events == tuple(SOFTWARE) and forced.open_fds() == 1  # cycles alone stays a perf event
    with pytest.raises(ConfigError, match="--counters"):
        CounterGroup(SOFTWARE, syscalls=FakePerf({}), source="bpf")
    # perf refused the software events too (perf_event_paranoid): /proc still counts them
    refused = proc_group(tmp_path, SOFTWARE, source="auto", missing={n: errno.EACCES for n in SOFTWARE})
    refused.add_pid(7)
    assert refused.read(7).events["task-clock"].supported


def _exit(tid: int, tgid: int, cpu_ticks: float, switches: int, minflt: int = 0) -> ThreadExit:
    return ThreadExit(tid, tgid, int(cpu_ticks * TICK_NS), minflt, 0, switches, 1_000_000)


def test_exit_records_fill_the_last_interval_of_a_reaped_process(tmp_path: Path) -> None:
    # GIVEN pid 7 with threads 7 and 8, read once after add_pid
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10, minflt=5)
    proc.thread(7, 7, voluntary=1, utime=6, minflt=5)
    proc.thread(7, 8, voluntary=2, utime=4)
    exits = ReplayExits()
    group = proc_group(tmp_path, exits=exits)
    group.add_pid(7)
    proc.process(7, utime=30, minflt=9)
    proc.thread(7, 7, voluntary=4, utime=20, minflt=9)
    proc.thread(7, 8, voluntary=5, utime=10)
    assert group.read(7).events["task-clock"].value == pytest.approx(20 * TICK_NS)
    # WHEN both threads exit after that reading, a thread 9 is born and gone unseen, and 7 is reaped;
    # a record of another process is delivered too
    exits.queued = [
        _exit(8, 7, 15, 9),
        _exit(9, 7, 3, 2, minflt=1),
        _exit(70, 70, 500, 100),
        _exit(7, 7, 27, 6, minflt=12),
    ]
    proc.end_process(7)
    group.pid_exited(7)
    after = group.read(7)
    # THEN the last reading plus each thread's part after it: CPU 20 + 5 + 3 + 7 ticks
    assert after.events["task-clock"].value == pytest.approx(35 * TICK_NS)
    assert after.events["page-faults"].value == 4 + 1 + 3
    assert after.events["context-switches"].value == (6 - 1) + (9 - 2) + 2
    assert "3 thread exit record(s)" in after.events["task-clock"].note
    assert "up to their exit" in after.events["context-switches"].note
    group.close()
    assert exits.closed


def _single_thread_pid_7(tmp_path: Path) -> tuple[FakeProc, ReplayExits, CounterGroup]:
    """Pid 7, one thread with 3 switches and 10 ticks, counted from /proc with replayed exits."""
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=3, utime=10)
    exits = ReplayExits()
    group = proc_group(tmp_path, exits=exits)
    group.add_pid(7)
    return proc, exits, group


def test_exit_within_the_first_interval_is_measured(tmp_path: Path) -> None:
    proc, exits, group = _single_thread_pid_7(tmp_path)
    exits.queued = [_exit(7, 7, 42, 8)]
    proc.end_process(7)
    group.pid_exited(7)
    counters = group.read(7)
    assert counters.cpu_seconds == pytest.approx(32 * TICK_NS / 1e9)
    assert counters.events["context-switches"].value == 5


def test_exits_before_a_reading_are_in_it_and_only_switches_are_added(tmp_path: Path) -> None:
    # GIVEN thread 8 seen once, then exited before the next reading (its CPU is in the process's stat)
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=1)
    proc.thread(7, 8, voluntary=2, utime=4)
    exits = ReplayExits()
    group = proc_group(tmp_path, exits=exits)
    group.add_pid(7)
    exits.queued = [_exit(8, 7, 9, 7)]
    proc.end_thread(7, 8)
    proc.process(7, utime=20)
    counters = group.read(7)
    # THEN CPU from the stat alone; the gone thread's 5 switches after its last reading are counted
    assert counters.events["task-clock"].value == pytest.approx(10 * TICK_NS)
    assert counters.events["context-switches"].value == 5
    # WHEN the process is reaped with no record after that reading: the reading stands
    proc.end_process(7)
    group.pid_exited(7)
    after = group.read(7)
    assert after.events["task-clock"].value == pytest.approx(10 * TICK_NS)
    assert "values as of its last reading" in after.events["task-clock"].note


def test_records_queued_before_add_pid_are_not_the_new_pids(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7)
    exits = ReplayExits()
    group = proc_group(tmp_path, exits=exits)
    group.add_pid(99)  # opens the listener
    exits.queued = [_exit(8, 7, 50, 50)]  # a thread of 7 that ended before 7 entered the scope
    group.add_pid(7)
    proc.end_process(7)
    group.pid_exited(7)
    assert group.read(7).events["task-clock"].value is None  # gone before its first reading, no record


def test_without_taskstats_or_with_overruns_the_notes_and_the_group_say_so(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=3)
    exits = ReplayExits(unavailable="taskstats unavailable (registering needs CAP_NET_ADMIN)")
    group = proc_group(tmp_path, exits=exits)
    group.add_pid(7)
    proc.end_process(7)
    group.pid_exited(7)
    note = group.read(7).events["task-clock"].note
    assert "not measured" in note and "CAP_NET_ADMIN" in note
    assert group.exits_note == exits.unavailable
    working = ReplayExits()
    other = proc_group(tmp_path, exits=working)
    assert other.exits_note == ""  # nothing opened yet
    proc.process(8, utime=1)
    other.add_pid(8)
    assert other.exits_note == ""
    working.overruns = 2
    assert "dropped exit records 2 time(s)" in other.exits_note
    other.close()
    assert working.closed and "dropped" in other.exits_note


def test_stop_exits_delivers_what_is_queued_and_unregisters(tmp_path: Path) -> None:
    proc, exits, group = _single_thread_pid_7(tmp_path)
    exits.queued = [_exit(7, 7, 30, 4)]
    group.stop_exits()  # the window ends; 7 is reaped afterwards
    assert exits.closed and exits.queued == []
    assert group.exits_note == ""  # closing a source that worked all window is no reason to warn
    proc.end_process(7)
    group.pid_exited(7)
    assert group.read(7).cpu_seconds == pytest.approx(20 * TICK_NS / 1e9)
    group.close()


def test_a_record_arriving_after_the_reading_that_missed_its_thread_is_not_counted_twice(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=1)
    proc.thread(7, 8, voluntary=2)
    exits = ReplayExits()
    group = proc_group(tmp_path, exits=exits)
    group.add_pid(7)
    proc.thread(7, 8, voluntary=6)
    assert group.read(7).events["context-switches"].value == 4
    # GIVEN thread 8 exits right after the drain of the next reading: that reading misses it and its record
    proc.end_thread(7, 8)
    assert group.read(7).events["context-switches"].value == 4
    # WHEN its record (8 switches in all) comes with the reading after
    exits.queued = [_exit(8, 7, 0, 8)]
    # THEN it replaces thread 8's last reading: 8 - 2, never 8 more
    assert group.read(7).events["context-switches"].value == 6


def test_with_exit_records_threads_are_read_once_a_period_and_totals_at_every_reading(tmp_path: Path) -> None:
    # GIVEN pid 7 counted with exit records, its threads read at most once an hour
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=1, utime=10)
    group = proc_group(tmp_path, exits=ReplayExits(), threads_every_s=3600)
    group.add_pid(7)
    # WHEN it runs on and is read within the hour
    proc.process(7, utime=30)
    proc.thread(7, 7, voluntary=9, involuntary=1, utime=30)
    between = group.read(7)
    # THEN its CPU is this reading's, its switches the last full reading's (the baseline: none yet)
    assert between.events["task-clock"].value == pytest.approx(20 * TICK_NS)
    assert between.events["context-switches"].value == 0
    # and closing reads the threads once more
    group.close()
    final = group.read(7)
    assert final.events["context-switches"].value == 9
    assert final.events["task-clock"].value == pytest.approx(20 * TICK_NS)


def test_without_exit_records_every_reading_reads_the_threads(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=1)
    group = proc_group(tmp_path, threads_every_s=3600)  # taskstats off: a gone thread's switches would be lost
    group.add_pid(7)
    proc.thread(7, 7, voluntary=4)
    assert group.read(7).events["context-switches"].value == 3


def test_a_process_gone_between_full_readings_is_its_last_full_reading_plus_its_exit_records(tmp_path: Path) -> None:
    # GIVEN pid 7 (threads 7 and 8) read in full at add_pid, then once for its totals alone
    proc = FakeProc(tmp_path)
    proc.process(7, utime=10)
    proc.thread(7, 7, voluntary=1, utime=6)
    proc.thread(7, 8, voluntary=2, utime=4)
    exits = ReplayExits()
    group = proc_group(tmp_path, exits=exits, threads_every_s=3600)
    group.add_pid(7)
    proc.process(7, utime=30)
    assert group.read(7).events["task-clock"].value == pytest.approx(20 * TICK_NS)
    # WHEN both threads exit (records: 7 ran 27 ticks, 8 ran 15 in all) and the process is reaped
    exits.queued = [_exit(8, 7, 15, 9), _exit(7, 7, 27, 6)]
    proc.end_process(7)
    group.pid_exited(7)
    after = group.read(7)
    # THEN its CPU is the records' from the full reading on (21 + 11 ticks), not the totals-only reading's
    # 20 ticks plus them again; the switches likewise
    assert after.events["task-clock"].value == pytest.approx(32 * TICK_NS)
    assert after.events["context-switches"].value == (6 - 1) + (9 - 2)
    # and a record that went missing leaves the totals-only reading standing, never less
    proc2 = FakeProc(tmp_path / "second")
    proc2.process(7, utime=10)
    proc2.thread(7, 7, voluntary=1, utime=6)
    proc2.thread(7, 8, voluntary=2, utime=4)
    exits2 = ReplayExits()
    group2 = proc_group(tmp_path / "second", exits=exits2, threads_every_s=3600)
    group2.add_pid(7)
    proc2.process(7, utime=30)
    group2.read(7)
    exits2.queued = [_exit(8, 7, 5, 9)]  # thread 7's record lost
    proc2.end_process(7)
    group2.pid_exited(7)
    assert group2.read(7).events["task-clock"].value == pytest.approx(20 * TICK_NS)
