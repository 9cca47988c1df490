"""Off-CPU time (profiler run --off-cpu): the cause rule, the per-PID file and its reader on hostile
content, the per-task split by the leaf-first rule, and the result rows' off-CPU columns."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.format import OFFCPU_COLUMNS, RESULT_COLUMNS, PidCounters, ProcessInfo
from profiler.capture.offcpu import (
    CAUSES,
    JAVA_IN_VM,
    JAVA_MONITOR,
    JAVA_NONE,
    JAVA_WAIT,
    OFFCPU_CONTEXTS_FILE,
    REASON_OTHER,
    REASON_PREEMPTED,
    REASON_SLEEPING,
    REASON_UNINTERRUPTIBLE,
    OffCpuEntry,
    classify_cause,
    format_offcpu,
    merge_entries,
    parse_offcpu_lines,
    read_offcpu,
)
from profiler.capture.read import read_pid_offcpu, read_pid_offcpu_contexts, read_pid_offcpu_timeline
from profiler.errors import CaptureFormatError
from profiler.matching.aggregate import aggregate_host
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher, match_offcpu, match_stacks

FUTEX = "entry_SYSCALL_64_[k];__x64_sys_futex_[k];futex_wait_[k];schedule_[k]"
PIPE = "entry_SYSCALL_64_[k];ksys_read_[k];vfs_read_[k];pipe_read_[k];schedule_[k]"
NANOSLEEP = "entry_SYSCALL_64_[k];__x64_sys_clock_nanosleep_[k];hrtimer_nanosleep_[k];do_nanosleep_[k];schedule_[k]"
EPOLL = "entry_SYSCALL_64_[k];do_epoll_wait_[k];ep_poll_[k];schedule_hrtimeout_range_[k]"


@pytest.mark.parametrize(
    ("reason", "stack", "cause"),
    [
        (REASON_PREEMPTED, f"t;main;{FUTEX}", "preempted"),  # runnable: the frames do not matter
        (REASON_SLEEPING, f"t;main;Parker::park;{FUTEX}", "lock"),
        (REASON_SLEEPING, f"t;main;JVM_Sleep;JavaThread::sleep(long);{FUTEX}", "sleep"),  # a user frame decides
        (REASON_SLEEPING, f"t;main;java.lang.Thread::sleep0;{FUTEX}", "sleep"),
        (REASON_SLEEPING, f"t;main;{NANOSLEEP}", "sleep"),
        (REASON_SLEEPING, f"t;main;{PIPE}", "net"),
        (REASON_SLEEPING, f"t;main;{EPOLL}", "net"),
        (REASON_SLEEPING, "t;main;ThreadBlockInVM::~ThreadBlockInVM();SafepointSynchronize::block(JavaThread*);"
         + FUTEX, "safepoint"),
        (REASON_UNINTERRUPTIBLE, "t;main;entry_SYSCALL_64_[k];io_schedule_[k];schedule_[k]", "disk"),
        (REASON_SLEEPING, "t;main;entry_SYSCALL_64_[k];do_wait_[k];schedule_[k]", "other"),
        (REASON_OTHER, f"t;main;{PIPE}", "other"),  # stopped or traced
    ],
)
def test_cause_from_reason_and_frames(reason: int, stack: str, cause: str) -> None:
    assert classify_cause(reason, stack) == cause


def test_kernel_names_do_not_decide_as_user_frames_and_the_thread_name_never_does() -> None:
    # a thread called "nanosleep" and a user function called pipe_read are not kernel waits
    assert classify_cause(REASON_SLEEPING, f"nanosleep;pipe_read;{FUTEX}") == "lock"


def test_format_and_read_round_trip_merges_and_orders(tmp_path: Path) -> None:
    entries = [
        OffCpuEntry("lock", "t;a b(int);futex_wait_[k]", 5_000_000, 2),
        OffCpuEntry("net", "t;x;pipe_read_[k]", 9_000_000, 3),
        OffCpuEntry("lock", "t;a b(int);futex_wait_[k]", 1_000_000, 1),
        OffCpuEntry("sleep", "t;y", 0, 0),  # nothing blocked: not written
    ]
    text = format_offcpu(entries)
    assert text == "net 9000000 3 t;x;pipe_read_[k]\nlock 6000000 3 t;a b(int);futex_wait_[k]\n"
    path = tmp_path / "offcpu.folded"
    path.write_text(text)
    assert read_offcpu(path) == merge_entries(entries[:3])


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("lock 12 3", "expected 'cause blocked_ns switches stack'"),
        ("lock 12 3  ", "expected 'cause blocked_ns switches stack'"),
        ("waiting 12 3 t;a", "unknown cause"),
        ("lock -12 3 t;a", "whole numbers"),
        ("lock 12 ² t;a", "whole numbers"),
        ("lock 99999999999999999999 3 t;a", "whole numbers"),
        ("lock 1e9 3 t;a", "whole numbers"),
        ("\x00 1 1 t", "unknown cause"),
    ],
)
def test_reader_refuses_hostile_lines_naming_file_and_line(line: str, problem: str) -> None:
    with pytest.raises(CaptureFormatError) as error:
        list(parse_offcpu_lines(["net 1 1 t;ok\n", "\n", line + "\n"], "cap/pids/7/offcpu.folded"))
    message = str(error.value)
    assert message.startswith("cap/pids/7/offcpu.folded:3: ") and problem in message and "fix" in message
    assert len(message) < 300 and "\n" not in message


def test_capture_without_offcpu_file_reads_as_none_and_with_one_as_entries(tmp_path: Path) -> None:
    assert read_pid_offcpu(tmp_path, 42) is None
    capture.write_offcpu(tmp_path, 42, [OffCpuEntry("disk", "t;io_schedule_[k]", 7, 1)])
    assert read_pid_offcpu(tmp_path, 42) == [OffCpuEntry("disk", "t;io_schedule_[k]", 7, 1)]


def test_blocked_time_goes_to_tasks_by_the_leaf_first_rule() -> None:
    matcher = Matcher(parse_profile("Poll: KafkaConsumer\nWorker: Executor task\n"))
    entries = [
        OffCpuEntry("net", "Executor task;KafkaConsumer.poll;ep_poll_[k]", 3_000_000_000, 10),
        OffCpuEntry("lock", "Executor task;Foo.bar;futex_wait_[k]", 1_000_000_000, 4),
        OffCpuEntry("lock", "Executor task;KafkaConsumer.poll;futex_wait_[k]", 500_000_000, 1),
        OffCpuEntry("sleep", "GC Thread;nanosleep_[k]", 250_000_000, 1),
    ]
    by_task = match_offcpu(matcher, entries)
    assert by_task == {
        "Poll": Counter({"net": 3_000_000_000, "lock": 500_000_000}),
        "Worker": Counter({"lock": 1_000_000_000}),
        "unmatched": Counter({"sleep": 250_000_000}),
    }


def test_result_rows_carry_offcpu_seconds_per_task_and_cause_and_none_without_off_cpu() -> None:
    assert RESULT_COLUMNS[-len(OFFCPU_COLUMNS):] == OFFCPU_COLUMNS
    assert ("offcpu_seconds", *(f"offcpu_{c}_seconds" for c in CAUSES), "wall_seconds") == OFFCPU_COLUMNS
    matcher = Matcher(parse_profile("Poll: KafkaConsumer\n"))
    workload = ProcessInfo(7, "workload", "spark", "executor", "u", "java", 0.0, 10.0)
    manager = ProcessInfo(8, "managing", "spark", "worker", "u", "java", 0.0, 10.0)
    matched = {7: match_stacks(matcher, {"E;KafkaConsumer.poll": 3, "E;x": 1})}
    offcpu = {7: {"Poll": Counter({"net": 2_000_000_000, "lock": 500_000_000})}, 8: {"Poll": Counter(lock=1)}}
    rows = aggregate_host("h", [workload, manager], matched, {}, {}, offcpu)
    by_key = {(r["pid"], r["task"]): r for r in rows}
    poll = by_key[(7, "Poll")]
    assert poll["offcpu_seconds"] == 2.5 and poll["offcpu_net_seconds"] == 2.0 and poll["offcpu_lock_seconds"] == 0.5
    assert poll["offcpu_disk_seconds"] == 0.0
    assert by_key[(7, "unmatched")]["offcpu_seconds"] == 0.0  # measured: nothing blocked there
    assert by_key[(7, "*")]["offcpu_seconds"] == 2.5
    assert by_key[(8, "*")]["offcpu_seconds"] is None  # a managing PID is not traced
    assert poll["wall_seconds"] is None  # no CPU seconds measured: no wall seconds either
    without = aggregate_host("h", [workload], matched, {}, {})
    assert all(row["offcpu_seconds"] is None and row["wall_seconds"] is None for row in without)


def test_wall_seconds_are_on_cpu_plus_off_cpu_seconds_per_task() -> None:
    matcher = Matcher(parse_profile("Poll: KafkaConsumer\n"))
    workload = ProcessInfo(7, "workload", "spark", "executor", "u", "java", 0.0, 10.0)
    matched = {7: match_stacks(matcher, {"E;KafkaConsumer.poll": 3, "E;x": 1})}
    counters = {7: PidCounters(7, {}, None, False, cpu_seconds=4.0)}
    offcpu = {7: {"Poll": Counter({"net": 2_000_000_000, "preempted": 500_000_000})}}
    rows = {r["task"]: r for r in aggregate_host("h", [workload], matched, counters, {}, offcpu)}
    assert rows["Poll"]["cpu_seconds"] == 3.0 and rows["Poll"]["wall_seconds"] == 5.5
    assert rows["unmatched"]["wall_seconds"] == 1.0 and rows["*"]["wall_seconds"] == 6.5


@pytest.mark.parametrize(
    ("java_state", "java_frame", "cause"),
    [
        (JAVA_MONITOR, "Worker::run [i]", "monitor"),  # entering a contended monitor, whatever the frame
        (JAVA_WAIT, "java.lang.Object::wait0", "wait"),
        (JAVA_IN_VM, "java.lang.Thread::sleep [i]", "sleep"),
        (JAVA_IN_VM, "java.lang.Thread::sleepNanos0", "sleep"),
        (JAVA_IN_VM, "jdk.internal.misc.Unsafe::park", "park"),
        (JAVA_IN_VM, "java.lang.Object::wait", "wait"),
        (JAVA_IN_VM, "com.example.Native::call", "lock"),  # a futex wait the JVM did not describe
        (JAVA_IN_VM, None, "lock"),
        (JAVA_NONE, None, "lock"),
    ],
)
def test_a_java_threads_futex_wait_takes_the_jvms_cause(java_state: int, java_frame: str | None, cause: str) -> None:
    assert classify_cause(REASON_SLEEPING, f"t;{FUTEX}", java_state, java_frame) == cause


def test_a_futex_wait_the_jvm_said_nothing_of_takes_the_cause_of_its_walked_java_frames() -> None:
    # GIVEN a pool thread not yet in the JVM's thread list (no view), its stack walked through the JDK's park
    pool = ("block-manager-storage-async-thread-pool-26;java.lang.Thread::run;"
            "java.util.concurrent.ThreadPoolExecutor::getTask;java.util.concurrent.locks.LockSupport::parkNanos [i];"
            "jdk.internal.misc.Unsafe::park;Unsafe_Park;Parker::park(bool, long);pthread_cond_timedwait")
    # THEN its futex wait is a park, as the JVM's last Java frame would have said
    assert classify_cause(REASON_SLEEPING, f"{pool};{FUTEX}", JAVA_NONE, None) == "park"
    assert classify_cause(REASON_SLEEPING, f"t;java.lang.Object::wait [i];JVM_MonitorWait;{FUTEX}") == "wait"
    # AND the JVM's own word still comes first, the kernel's net wait before both, a thread name never counts
    assert classify_cause(REASON_SLEEPING, f"{pool};{FUTEX}", JAVA_MONITOR, None) == "monitor"
    assert classify_cause(REASON_SLEEPING, f"{pool};{EPOLL};{FUTEX}") == "net"
    assert classify_cause(REASON_SLEEPING, f"jdk.internal.misc.Unsafe::park;{FUTEX}") == "lock"
    assert classify_cause(REASON_SLEEPING, f"t;native_wait;{FUTEX}") == "lock"


def test_the_jvms_word_never_overrides_the_kernels_for_net_disk_preemption_or_a_missing_futex() -> None:
    park = "jdk.internal.misc.Unsafe::park"
    assert classify_cause(REASON_SLEEPING, f"t;{PIPE}", JAVA_MONITOR, park) == "net"
    assert classify_cause(REASON_SLEEPING, f"t;{EPOLL};{FUTEX}", JAVA_IN_VM, park) == "net"
    assert classify_cause(REASON_PREEMPTED, f"t;{FUTEX}", JAVA_WAIT, park) == "preempted"
    assert classify_cause(REASON_UNINTERRUPTIBLE, f"t;{FUTEX}", JAVA_WAIT, park) == "disk"
    assert classify_cause(REASON_SLEEPING, "t;[lost kernel stack]", JAVA_WAIT, park) == "other"


def test_contexts_of_the_timeline_round_trip_without_repeating_stacks(tmp_path: Path) -> None:
    # GIVEN two task threads blocked in one stack in interval 0 and one of them again in interval 1
    stage3 = "Executor task launch worker for task 1.0 in stage 3.0 (TID 8)"
    stage4 = "Executor task launch worker for task 2.0 in stage 4.0 (TID 9)"
    stack = "Executor task launch worker;Unsafe::park;futex_wait_[k]"
    by_interval = {
        0: [OffCpuEntry("park", stack, 4, 1, stage3), OffCpuEntry("park", stack, 6, 2, stage4),
            OffCpuEntry("lock", "VM Thread;futex_wait_[k]", 9, 1)],
        1: [OffCpuEntry("park", stack, 5, 1, stage3)],
    }
    # WHEN the timeline is written and read back
    capture.write_offcpu_timeline(tmp_path, 42, by_interval)
    # THEN the timeline sums over the contexts, the contexts file holds each task's part by line
    timeline = read_pid_offcpu_timeline(tmp_path, 42)
    assert timeline == {0: [OffCpuEntry("park", stack, 10, 3), OffCpuEntry("lock", "VM Thread;futex_wait_[k]", 9, 1)],
                        1: [OffCpuEntry("park", stack, 5, 1)]}
    contexts = read_pid_offcpu_contexts(tmp_path, 42)
    assert contexts == {0: [OffCpuEntry("park", stack, 4, 1, stage3), OffCpuEntry("park", stack, 6, 2, stage4)],
                        1: [OffCpuEntry("park", stack, 5, 1, stage3)]}
    raw = (tmp_path / "pids" / "42" / OFFCPU_CONTEXTS_FILE).read_text()
    assert raw.count("futex_wait") == 0 and raw.count("stage 3.0") == 1


def test_a_capture_without_contexts_file_reads_as_not_measured_and_one_without_contexts_as_none(
    tmp_path: Path,
) -> None:
    assert read_pid_offcpu_contexts(tmp_path, 42) is None
    capture.write_offcpu_timeline(tmp_path, 42, {0: [OffCpuEntry("lock", "t;futex_wait_[k]", 9, 1)]})
    assert read_pid_offcpu_contexts(tmp_path, 42) == {}


@pytest.mark.parametrize(
    "rows",
    [[[0, 1, 10, 1]], [[1, 1, 1, 1]], [[0, 2, 1, 1]], [[0, 0, 1, 1]], [[0, 1, 1]], [[0, 1, True, 1]], ["x"]],
)
def test_contexts_rows_that_do_not_fit_the_timeline_are_refused_naming_the_file(tmp_path: Path, rows: list) -> None:
    capture.write_offcpu_timeline(tmp_path, 42, {0: [OffCpuEntry("lock", "t;futex_wait_[k]", 9, 1)]})
    path = tmp_path / "pids" / "42" / OFFCPU_CONTEXTS_FILE
    path.write_text(json.dumps({"contexts": ["a (1/2)#0"], "rows": rows}))
    with pytest.raises(CaptureFormatError) as error:
        read_pid_offcpu_contexts(tmp_path, 42)
    assert str(error.value).startswith(f"{path}: row 1 ") and "re-run" in str(error.value)


def test_thread_sets_round_trip_beside_offcpu_folded_and_old_captures_have_none(tmp_path: Path) -> None:
    from profiler.capture.offcpu import OFFCPU_THREADS_FILE

    # GIVEN two stacks of one pool's threads (one set written once) and a stack whose threads are not known
    entries = [
        OffCpuEntry("net", "pool;read_[k]", 5_000, 2, threads=frozenset({21, 22})),
        OffCpuEntry("lock", "pool;futex_wait_[k]", 3_000, 1, threads=frozenset({22, 21})),
        OffCpuEntry("sleep", "main;nanosleep_[k]", 1_000, 1),
    ]
    capture.write_offcpu(tmp_path, 7, entries)
    payload = json.loads((tmp_path / "pids" / "7" / OFFCPU_THREADS_FILE).read_text())
    assert payload == {"offcpu": "offcpu.folded", "sets": [[21, 22]], "lines": [0, 0, -1]}
    # WHEN it is read back THEN each line has its threads again
    read = read_pid_offcpu(tmp_path, 7)
    assert read is not None and [(e.stack, e.threads) for e in read] == [
        ("pool;read_[k]", frozenset({21, 22})), ("pool;futex_wait_[k]", frozenset({21, 22})),
        ("main;nanosleep_[k]", None),
    ]  # fmt: skip
    # AND a capture without the file (older, or a recovered run's) reads with no thread known
    capture.write_offcpu(tmp_path, 8, [OffCpuEntry("sleep", "main;nanosleep_[k]", 1_000, 1)])
    assert not (tmp_path / "pids" / "8" / OFFCPU_THREADS_FILE).exists()
    assert [e.threads for e in read_pid_offcpu(tmp_path, 8) or []] == [None]


@pytest.mark.parametrize(
    "payload",
    [
        {"sets": [[21]], "lines": [0]},  # fewer lines than offcpu.folded has
        {"sets": [[21]], "lines": [0, 1, 0]},  # an index past the sets
        {"sets": [[0]], "lines": [0, 0, 0]},  # no thread id 0
        {"sets": [[1 << 23]], "lines": [0, 0, 0]},  # beyond pid_max
        {"sets": [["21"]], "lines": [0, 0, 0]},
        {"sets": [[21]], "lines": [True, 0, 0]},
        {"sets": 5, "lines": [0, 0, 0]},
        [],
    ],
)
def test_a_thread_file_that_does_not_fit_its_offcpu_folded_is_refused(tmp_path: Path, payload: object) -> None:
    from profiler.capture.offcpu import OFFCPU_THREADS_FILE
    from profiler.errors import CaptureFormatError

    capture.write_offcpu(tmp_path, 7, [
        OffCpuEntry("net", "a;read_[k]", 5_000, 2, threads=frozenset({21})),
        OffCpuEntry("lock", "b;futex_wait_[k]", 3_000, 1, threads=frozenset({21})),
        OffCpuEntry("sleep", "c;nanosleep_[k]", 1_000, 1, threads=frozenset({21})),
    ])  # fmt: skip
    (tmp_path / "pids" / "7" / OFFCPU_THREADS_FILE).write_text(json.dumps(payload))
    with pytest.raises(CaptureFormatError, match=OFFCPU_THREADS_FILE):
        read_pid_offcpu(tmp_path, 7)
