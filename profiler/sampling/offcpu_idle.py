"""Threads blocked for the whole window (``profiler run --off-cpu``): they have no sched_switch in the window,
so offcpu_trace.c never sees them. They are found from /proc instead: each scoped thread's schedstat (its
run time and number of times it ran) is read as its process enters the scope and again at the window's end;
a thread whose figures did not change never ran meanwhile, so it was blocked all that time. Its cause comes
from its scheduler state, its kernel stack (/proc/PID/task/TID/stack, else its wchan) and, for a JVM
thread, what the JVM records of it (offcpu_java.JavaThreadWatch).

Everything under /proc/PID is the target's: a thread can vanish at any read (ENOENT, ESRCH), a PID can be
reused (a thread's start time tells), its name holds any byte. Reads are bounded and failures skip the
thread. The parsers are pure and take text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..capture.offcpu import (
    JAVA_NONE,
    REASON_OTHER,
    REASON_PREEMPTED,
    REASON_SLEEPING,
    REASON_UNINTERRUPTIBLE,
    WHOLE_WINDOW_FRAME,
    OffCpuEntry,
    classify_cause,
    merge_entries,
)
from ..files import procstat
from ..symbols.symbolize import fold_stack
from .proc_counters import ProcFiles

MAX_THREADS = 1 << 16  # per process: more task entries than this are not read
MAX_KERNEL_FRAMES = 128

# /proc/PID/stat's state letter -> the reason offcpu_trace.c would have stored at the switch-out
_PROC = ProcFiles()  # bounded reads that follow no link, regular files only (the counters' reader)
_REASONS = {"S": REASON_SLEEPING, "D": REASON_UNINTERRUPTIBLE, "R": REASON_PREEMPTED}


@dataclass(frozen=True)
class ThreadMark:
    """What /proc says of one thread at one moment."""

    tid: int
    comm: str
    state: str  # /proc stat's state letter
    start_ticks: int  # the thread's start time: a reused tid has another
    run_ns: int  # schedstat: time on a CPU so far
    slices: int  # schedstat: times it was run so far


@dataclass(frozen=True)
class IdleThread:
    """A thread that did not run between its process's mark and the window's end."""

    tid: int
    comm: str
    reason: int  # REASON_*
    blocked_ns: int
    kernel_leaf_first: list[str] | None  # None: neither its stack nor its wchan could be read
    java_state: int = JAVA_NONE
    java_frame: int = 0


def parse_stat(text: str) -> tuple[str, str, int] | None:
    """(comm, state letter, start time in ticks) of /proc/.../stat text; None when malformed. The comm may
    hold spaces and parentheses (``procstat``)."""
    line = procstat.split_stat(text)
    start = line.count(procstat.STARTTIME) if line is not None else None
    if line is None or start is None or len(line.state) != 1:
        return None
    return line.comm, line.state, start


def parse_schedstat(text: str) -> tuple[int, int] | None:
    """(run time ns, times run) of /proc/.../schedstat text (``run_ns wait_ns slices``); None when malformed."""
    fields = text.split()
    if len(fields) < 3 or not (fields[0].isdigit() and fields[2].isdigit()):
        return None
    return int(fields[0]), int(fields[2])


def parse_kernel_stack(text: str) -> list[str]:
    """Function names, leaf first, of /proc/.../stack text (``[<0>] name+0x74/0xf0`` per line)."""
    frames = []
    for line in text.splitlines()[:MAX_KERNEL_FRAMES]:
        _, _, rest = line.partition("] ")
        name = rest.split("+", 1)[0].strip()
        if name and all(c.isalnum() or c in "_.$" for c in name):
            frames.append(name)
    return frames


def parse_wchan(text: str) -> list[str] | None:
    """The one kernel function /proc/.../wchan names ("0" or empty: none known)."""
    name = text.strip()
    if not name or name == "0" or not all(c.isalnum() or c in "_.$" for c in name) or len(name) > 128:
        return None
    return [name]


def never_ran(before: ThreadMark, after: ThreadMark) -> bool:
    """The same thread (start time), not run in between (run time and run count unchanged)."""
    return (before.start_ticks, before.run_ns, before.slices) == (after.start_ticks, after.run_ns, after.slices)


def read_mark(pid: int, tid: int) -> ThreadMark | None:
    """The thread's mark now; None when it is gone or its files do not parse."""
    base = f"{pid}/task/{tid}"
    stat_text = _PROC.text(f"{base}/stat")
    sched_text = _PROC.text(f"{base}/schedstat")
    stat = parse_stat(stat_text) if stat_text is not None else None
    sched = parse_schedstat(sched_text) if sched_text is not None else None
    if stat is None or sched is None:
        return None
    return ThreadMark(tid, stat[0], stat[1], stat[2], sched[0], sched[1])


def read_marks(pid: int) -> dict[int, ThreadMark]:
    """Every thread of ``pid`` now (none when the process is gone)."""
    marks = {}
    for tid in (_PROC.tasks(pid) or [])[:MAX_THREADS]:
        mark = read_mark(pid, tid)
        if mark is not None:
            marks[mark.tid] = mark
    return marks


def read_kernel_stack(pid: int, tid: int) -> list[str] | None:
    """A blocked thread's kernel stack, leaf first: /proc's stack, else its wchan; None when neither."""
    base = f"{pid}/task/{tid}"
    text = _PROC.text(f"{base}/stack")
    frames = parse_kernel_stack(text) if text is not None else []
    if frames:
        return frames
    wchan = _PROC.text(f"{base}/wchan")
    return parse_wchan(wchan) if wchan is not None else None


JavaView = Callable[[int], tuple[int, int]]  # tid -> (java_state, java_frame) of a followed JVM thread


class WholeWindowWatch:
    """The marks of each scoped process's threads (``begin``), and at the window's end the threads that
    did not run since (``finish``)."""

    def __init__(self) -> None:
        self._marks: dict[int, tuple[int, dict[int, ThreadMark]]] = {}  # pid -> (mark time ns, marks)

    def begin(self, pid: int, now_ns: int) -> None:
        self._marks[pid] = (now_ns, read_marks(pid))

    def forget(self, pid: int) -> None:
        """The process exited: its threads cannot be read at the end (their blocks until then are not known)."""
        self._marks.pop(pid, None)

    def finish(
        self, end_ns: int, min_block_ns: int, java_view: Callable[[int], JavaView]
    ) -> dict[int, list[IdleThread]]:
        """The threads that never ran since their process's mark, per PID. A thread's stack and the JVM's
        view are read first and its mark after: if it ran meanwhile it is left out."""
        found: dict[int, list[IdleThread]] = {}
        for pid, (begin_ns, marks) in sorted(self._marks.items()):
            if end_ns - begin_ns < min_block_ns:
                continue
            view = java_view(pid)
            for _tid, before in sorted(marks.items()):
                idle = _idle_thread(pid, before, end_ns - begin_ns, view)
                if idle is not None:
                    found.setdefault(pid, []).append(idle)
        return found


def _idle_thread(pid: int, before: ThreadMark, blocked_ns: int, view: JavaView) -> IdleThread | None:
    after = read_mark(pid, before.tid)
    if after is None or not never_ran(before, after):
        return None
    kernel = read_kernel_stack(pid, before.tid)
    java_state, java_frame = view(before.tid)
    last = read_mark(pid, before.tid)
    if last is None or not never_ran(before, last):
        return None  # woke while it was read: the stack may be another moment's
    return IdleThread(
        before.tid, before.comm, _REASONS.get(before.state, REASON_OTHER), blocked_ns, kernel, java_state, java_frame
    )


def idle_entries(
    threads: list[IdleThread],
    java_name: Callable[[int], str | None],
    labels: Mapping[tuple[int, int, str], tuple[str, str | None]] | None = None,
    tgid: int = 0,
) -> list[OffCpuEntry]:
    """Entries of one process's idle threads: ``name;[blocked all window];<last Java frame>;<kernel frames>``,
    the cause as for a walked block (the user frames are not known: only the JVM's last Java frame). The
    name is the thread's kind in ``labels`` ((tgid, tid, comm) -> kind and context), else its comm."""
    entries = []
    for thread in threads:
        frame = java_name(thread.java_frame) if thread.java_frame else None
        user = [frame] if frame is not None else []
        kind, context = (labels or {}).get((tgid, thread.tid, thread.comm), (thread.comm, None))
        stack = fold_stack(kind, [*user, WHOLE_WINDOW_FRAME], thread.kernel_leaf_first)
        cause = classify_cause(thread.reason, stack, thread.java_state, frame)
        entries.append(OffCpuEntry(cause, stack, thread.blocked_ns, 1, context, frozenset((thread.tid,))))
    return merge_entries(entries)
