"""Threads blocked for the whole window (profiler/sampling/offcpu_idle.py): the /proc parsers on hostile
text, the never-ran rule, the entries' stacks and causes, and the watch on a real sleeping process."""

from __future__ import annotations

import subprocess
import time

import pytest

from profiler.capture.offcpu import JAVA_NONE, JAVA_WAIT, REASON_PREEMPTED, REASON_SLEEPING
from profiler.sampling.offcpu_idle import (
    IdleThread,
    ThreadMark,
    WholeWindowWatch,
    idle_entries,
    never_ran,
    parse_kernel_stack,
    parse_schedstat,
    parse_stat,
    parse_wchan,
    read_marks,
)  # fmt: skip

STAT_TAIL = " S 1 1 1 0 -1 4194304 128 0 0 0 0 0 0 0 20 0 1 0 3589307 2990080 393 18446744073709551615 0 0"


def test_parse_stat_takes_the_comm_up_to_the_last_parenthesis() -> None:
    # GIVEN a thread name with spaces and parentheses (the target chooses it)
    text = "123 (a) S (b) c)" + STAT_TAIL
    # THEN the comm, the state and the start time are the fields after the last ')'
    assert parse_stat(text) == ("a) S (b) c", "S", 3589307)


@pytest.mark.parametrize(
    "text", ["", "123 no parens", "123 (x)", "123 (x) S 1 2", "12 (x)" + STAT_TAIL.replace("3589307", "-5")]
)
def test_parse_stat_refuses_malformed_text(text: str) -> None:
    assert parse_stat(text) is None


def test_parse_schedstat() -> None:
    assert parse_schedstat("1000846 269142 7\n") == (1000846, 7)
    assert parse_schedstat("1000846 269142") is None
    assert parse_schedstat("x 1 2") is None


def test_parse_kernel_stack_leaf_first_without_offsets_and_garbage() -> None:
    text = (
        "[<0>] futex_wait_queue+0x60/0x90\n[<0>] __futex_wait+0x8b/0x120\n[<0>] bad name;x+0x1/0x2\n"
        "garbage\n[<0>] do_syscall_64+0x71/0x280\n"
    )
    assert parse_kernel_stack(text) == ["futex_wait_queue", "__futex_wait", "do_syscall_64"]
    assert parse_kernel_stack("[<0>] a+0x1/0x2\n" * 1000)[:1] == ["a"]
    assert len(parse_kernel_stack("[<0>] a+0x1/0x2\n" * 1000)) == 128


def test_parse_wchan() -> None:
    assert parse_wchan("hrtimer_nanosleep") == ["hrtimer_nanosleep"]
    assert parse_wchan("0") is None
    assert parse_wchan("") is None
    assert parse_wchan("a;b") is None


def _mark(**changes: object) -> ThreadMark:
    fields: dict[str, object] = dict(tid=5, comm="t", state="S", start_ticks=10, run_ns=100, slices=3)
    fields.update(changes)
    return ThreadMark(**fields)  # type: ignore[arg-type]


def test_never_ran_needs_the_same_thread_and_no_run() -> None:
    assert never_ran(_mark(), _mark(state="R"))  # woken at the end, not yet run: still blocked all the time
    assert not never_ran(_mark(), _mark(run_ns=101))
    assert not never_ran(_mark(), _mark(slices=4))
    assert not never_ran(_mark(), _mark(start_ticks=11))  # the tid was reused


def test_idle_entries_stack_and_cause() -> None:
    # GIVEN a JVM thread in Object.wait all window and a native thread asleep
    waiting = IdleThread(
        7, "idler", REASON_SLEEPING, 5_000_000_000, ["futex_wait_queue", "__futex_wait"], JAVA_WAIT, 42
    )
    sleeping = IdleThread(8, "dozer", REASON_SLEEPING, 5_000_000_000, ["hrtimer_nanosleep"], JAVA_NONE, 0)
    unknown = IdleThread(9, "gone;x", REASON_PREEMPTED, 5_000_000_000, None)
    names = {42: "java.lang.Object::wait"}
    entries = {e.stack: e for e in idle_entries([waiting, sleeping, unknown], names.get)}
    # THEN the stack is thread, marker, last Java frame, kernel frames root first; the cause as for a walk
    wait = entries["idler;[blocked all window];java.lang.Object::wait;__futex_wait_[k];futex_wait_queue_[k]"]
    assert (wait.cause, wait.blocked_ns, wait.switches) == ("wait", 5_000_000_000, 1)
    assert wait.threads == frozenset({7})  # the thread counts in its task's distinct threads
    assert entries["dozer;[blocked all window];hrtimer_nanosleep_[k]"].cause == "sleep"
    assert entries["gone:x;[blocked all window];[lost kernel stack]"].cause == "preempted"


def test_the_watch_finds_a_real_thread_that_never_ran_and_not_one_that_did() -> None:
    # GIVEN a process asleep all the time and one that wakes every 10 ms
    asleep = subprocess.Popen(["sleep", "60"])
    busy = subprocess.Popen(["sh", "-c", "while :; do sleep 0.01; done"])
    try:
        time.sleep(0.3)
        watch = WholeWindowWatch()
        begin = time.monotonic_ns()
        watch.begin(asleep.pid, begin)
        watch.begin(busy.pid, begin)
        watch.begin(2**22 + 12345, begin)  # no such process: nothing, no error
        time.sleep(0.5)
        # WHEN the window ends
        found = watch.finish(time.monotonic_ns(), 1_000_000, lambda _pid: lambda _tid: (JAVA_NONE, 0))
    finally:
        asleep.kill()
        busy.kill()
        asleep.wait()
        busy.wait()
    # THEN the sleeper is blocked the whole window, asleep in the kernel's nanosleep; the shell is not
    assert list(found) == [asleep.pid]
    (thread,) = found[asleep.pid]
    assert thread.tid == asleep.pid and thread.comm == "sleep" and thread.reason == REASON_SLEEPING
    assert 0.5e9 <= thread.blocked_ns < 5e9
    assert thread.kernel_leaf_first and "nanosleep" in " ".join(thread.kernel_leaf_first)
    # AND a process that is gone has no marks
    assert read_marks(asleep.pid) == {}
