"""Off-CPU time of one PID (``pids/<pid>/offcpu.folded``, ``profiler run --off-cpu``): blocked
nanoseconds per (cause, stack), and the rule that names the cause from the kernel's reason and the frames.

Pure (text in, records out): the host agent writes and reads it, the analysis reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CaptureFormatError
from ..files.textinput import open_text
from .folded import FRAME_SEPARATOR, KERNEL_SUFFIX, MAX_COUNT, is_count

OFFCPU_FILE = "offcpu.folded"
# below the thread name: a thread blocked all window, read from /proc (profiler/sampling/offcpu_idle.py), not walked
WHOLE_WINDOW_FRAME = "[blocked all window]"
# `profiler run --off-cpu-sample-every`'s default: beyond a thread's first 100 voluntary switch-outs a second,
# one in 10 is followed (docs/offcpu.md "Cost": ~0.9 µs of BPF time per context switch instead of ~4.7)
DEFAULT_SAMPLE_EVERY = 10

# Causes, in report order. ``sleep``: a timed sleep (nanosleep, Thread.sleep); ``monitor``: a Java thread
# entering a contended monitor (synchronized); ``wait``: Object.wait; ``park``: LockSupport.park (the
# java.util.concurrent locks, queues and pools); ``lock``: any other futex wait (native locks and condition
# variables, a JVM thread whose wait the JVM did not describe); ``net``: waiting for data or room on a
# socket, pipe or poll set; ``disk``: uninterruptible sleep (block I/O, page faults, some kernel locks);
# ``preempted``: runnable but descheduled (CPU contention); ``safepoint``: a JVM thread stopped for GC or
# another safepoint; ``other``: a voluntary sleep none of the rules names.
CAUSE_SLEEP, CAUSE_LOCK, CAUSE_NET, CAUSE_DISK = "sleep", "lock", "net", "disk"
CAUSE_PREEMPTED, CAUSE_SAFEPOINT, CAUSE_OTHER = "preempted", "safepoint", "other"
CAUSE_MONITOR, CAUSE_WAIT, CAUSE_PARK = "monitor", "wait", "park"
CAUSES: tuple[str, ...] = (
    CAUSE_LOCK, CAUSE_MONITOR, CAUSE_WAIT, CAUSE_PARK, CAUSE_NET, CAUSE_DISK, CAUSE_SLEEP, CAUSE_SAFEPOINT,
    CAUSE_PREEMPTED, CAUSE_OTHER,
)

# The kernel's reason a thread left the CPU (profiler/sampling/offcpu_trace.c, REASON_*).
REASON_PREEMPTED, REASON_SLEEPING, REASON_UNINTERRUPTIBLE, REASON_OTHER = 0, 1, 2, 3
# What the JVM said of the thread at the switch-out (offcpu_trace.c, JAVA_*): no JavaThread known, a Java
# thread, one entering a contended monitor, one in Object.wait.
JAVA_NONE, JAVA_IN_VM, JAVA_MONITOR, JAVA_WAIT = 0, 1, 2, 3

# Frames, leaf first, that name the wait. A user frame decides before a kernel frame for sleeps and
# safepoints, because the JVM's Thread.sleep and its safepoint wait are futex waits to the kernel.
_SAFEPOINT_FRAMES = ("SafepointSynchronize::block", "SafepointMechanism::process", "ThreadBlockInVM")
_SLEEP_USER_FRAMES = ("JVM_Sleep", "Thread::sleep")  # also JavaThread::sleep, Thread::sleep0, sleepNanos
# The last Java frame of a blocked thread (offcpu_trace.c reads it from the JVM): the Java methods that
# block the thread. JDK 17: Thread.sleep, Unsafe.park; JDK 21+: Thread.sleep0 / sleepNanos0.
_SLEEP_JAVA_FRAMES = ("java.lang.Thread::sleep",)
_PARK_JAVA_FRAMES = ("jdk.internal.misc.Unsafe::park", "sun.misc.Unsafe::park")
_WAIT_JAVA_FRAMES = ("java.lang.Object::wait",)
_SLEEP_KERNEL_FRAMES = ("nanosleep", "hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep")
_NET_KERNEL_FRAMES = (
    "tcp_recvmsg", "tcp_sendmsg", "unix_stream_read", "unix_stream_recvmsg", "sk_wait_data", "sock_recvmsg",
    "sock_sendmsg", "ep_poll", "do_epoll_wait", "do_sys_poll", "do_select", "pipe_read", "pipe_write",
    "inet_csk_accept", "inet_accept", "skb_recv_datagram", "udp_recvmsg",
)
_LOCK_KERNEL_FRAMES = ("futex_wait", "futex_q_wait", "__futex_wait", "do_futex", "rwsem_down", "mutex_lock")


@dataclass(frozen=True)
class OffCpuEntry:
    """Blocked time of one stack of one PID for one cause: the sum over ``switches`` blocks, each at
    least the run's minimum blocked time."""

    cause: str
    stack: str  # folded, root first: thread name, user frames, kernel frames (``_[k]``)
    blocked_ns: int
    switches: int
    # the thread's full name when it carries a unit of work (a Spark task, a Flink subtask: the on-CPU
    # samples' context, profiler/scope/threadnames.py); the stack's root is then the name's kind
    context: str | None = None
    # the ids of the PID's threads that were blocked here; None: not known (a capture without
    # offcpu_threads.json, a sub-window, a checkpoint). A set, not a count: a task's threads are the union
    # over its stacks, and a thread blocked under two of them counts once
    threads: frozenset[int] | None = None


def _has(frames: Sequence[str], needles: Sequence[str], kernel: bool) -> bool:
    for frame in frames:
        if frame.endswith(KERNEL_SUFFIX) != kernel:
            continue
        name = frame[: -len(KERNEL_SUFFIX)] if kernel else frame
        if any(needle in name for needle in needles):
            return True
    return False


def java_cause(java_state: int, java_frame: str | None) -> str | None:
    """The cause the JVM itself gives a Java thread's futex wait, or None (not a Java wait we know)."""
    if java_state == JAVA_MONITOR:
        return CAUSE_MONITOR
    if java_state == JAVA_WAIT:
        return CAUSE_WAIT
    if java_frame is None:
        return None
    if java_frame.startswith(_SLEEP_JAVA_FRAMES):
        return CAUSE_SLEEP
    if java_frame.startswith(_PARK_JAVA_FRAMES):
        return CAUSE_PARK
    if java_frame.startswith(_WAIT_JAVA_FRAMES):
        return CAUSE_WAIT
    return None


def walked_java_cause(frames: Sequence[str]) -> str | None:
    """The cause a walked stack's own Java frames give a futex wait the JVM said nothing of (a thread that
    was not in its thread list yet: a pool's new threads, issue 50): its leaf-most blocking Java frame,
    read as ``java_cause`` reads a last Java frame (``Unsafe::park`` → park, ``Object::wait`` → wait)."""
    for frame in reversed(frames):
        if not frame.endswith(KERNEL_SUFFIX):
            cause = java_cause(JAVA_NONE, frame)
            if cause is not None:
                return cause
    return None


def classify_cause(reason: int, stack: str, java_state: int = JAVA_NONE, java_frame: str | None = None) -> str:
    """The cause of a block: the kernel's ``reason`` refined by the frames of the folded ``stack`` and, for
    a Java thread, what the JVM said of it (``java_state``, JAVA_*; ``java_frame``: its last Java frame),
    else what its walked Java frames say (``walked_java_cause``)."""
    if reason == REASON_PREEMPTED:
        return CAUSE_PREEMPTED
    frames = stack.split(FRAME_SEPARATOR)[1:]  # the root is the thread name
    if _has(frames, _SAFEPOINT_FRAMES, kernel=False):
        return CAUSE_SAFEPOINT
    if reason == REASON_UNINTERRUPTIBLE:
        return CAUSE_DISK
    if reason != REASON_SLEEPING:
        return CAUSE_OTHER
    if _has(frames, _SLEEP_USER_FRAMES, kernel=False) or _has(frames, _SLEEP_KERNEL_FRAMES, kernel=True):
        return CAUSE_SLEEP
    # The JVM's word counts only for a futex wait: a Java thread reading a socket is waiting for the network
    if _has(frames, _LOCK_KERNEL_FRAMES, kernel=True) and not _has(frames, _NET_KERNEL_FRAMES, kernel=True):
        from_jvm = java_cause(java_state, java_frame)
        if from_jvm is None:
            from_jvm = walked_java_cause(frames)
        if from_jvm is not None:
            return from_jvm
    if _has(frames, _NET_KERNEL_FRAMES, kernel=True):
        return CAUSE_NET
    if _has(frames, _LOCK_KERNEL_FRAMES, kernel=True):
        return CAUSE_LOCK
    return CAUSE_OTHER


def merge_entries(entries: Iterable[OffCpuEntry], keep_contexts: bool = True) -> list[OffCpuEntry]:
    """One entry per (cause, stack, context) (per (cause, stack) without ``keep_contexts``), most blocked
    time first, ties by cause, stack and context (deterministic); its threads the union of the known ones
    (None when no merged entry knew its threads)."""
    sums: dict[tuple[str, str, str | None], list[int]] = {}
    threads: dict[tuple[str, str, str | None], frozenset[int] | set[int]] = {}
    for entry in entries:
        key = (entry.cause, entry.stack, entry.context if keep_contexts else None)
        total = sums.setdefault(key, [0, 0])
        total[0] += entry.blocked_ns
        total[1] += entry.switches
        if entry.threads is not None:  # a set grown in place: a pool's stack merges thousands of blocks
            known = threads.get(key)
            if known is None:
                threads[key] = entry.threads  # kept as is while no other entry merges into it (a file's lines)
            else:
                grown = known if isinstance(known, set) else set(known)
                grown.update(entry.threads)
                threads[key] = grown
    frozen = {key: tids if isinstance(tids, frozenset) else frozenset(tids) for key, tids in threads.items()}
    merged = [
        OffCpuEntry(cause, stack, ns, switches, context, frozen.get((cause, stack, context)))
        for (cause, stack, context), (ns, switches) in sums.items()
    ]
    return sorted(merged, key=lambda e: (-e.blocked_ns, e.cause, e.stack, e.context or ""))


def format_offcpu(entries: Iterable[OffCpuEntry]) -> str:
    """``cause blocked_ns switches stack`` per line (the stack last: its frames may hold spaces), summed over
    the contexts (they go to offcpu_contexts.json: ``format_offcpu_contexts``)."""
    return format_offcpu_lines(folded_lines(entries))


def format_offcpu_lines(lines: Iterable[OffCpuEntry], prefix: str = "") -> str:
    """offcpu.folded's text of ``folded_lines``' entries (merged already: written as they come), each line
    after ``prefix`` (offcpu_timeline.folded's interval)."""
    return "".join(f"{prefix}{e.cause} {e.blocked_ns} {e.switches} {e.stack}\n" for e in lines)


OFFCPU_THREADS_FILE = "offcpu_threads.json"
# Linux's largest pid_max (2^22): a thread id above it is not one
MAX_THREAD_ID = 1 << 22


def folded_lines(entries: Iterable[OffCpuEntry]) -> list[OffCpuEntry]:
    """The entries of ``format_offcpu``'s lines, in its order (one per (cause, stack), contexts summed)."""
    return [e for e in merge_entries(entries, keep_contexts=False) if e.blocked_ns > 0]


def format_offcpu_threads(lines: Sequence[OffCpuEntry], offcpu_file: str = OFFCPU_FILE) -> str | None:
    """offcpu_threads.json: the thread ids blocked under each of ``lines`` (``folded_lines``' entries, the
    lines of ``offcpu_file``), as an index into distinct thread sets (a pool's threads share their stacks:
    each set is written once); -1: that line's threads are not known. None when no line's are known."""
    if all(entry.threads is None for entry in lines):
        return None
    sets: dict[frozenset[int], int] = {}  # a frozenset keeps its hash: no sorting per line
    indexes = [-1 if entry.threads is None else sets.setdefault(entry.threads, len(sets)) for entry in lines]
    payload = {"offcpu": offcpu_file, "sets": [sorted(tids) for tids in sets], "lines": indexes}
    return json.dumps(payload, separators=(",", ":")) + "\n"


def _thread_set(value: object) -> frozenset[int] | None:
    if not isinstance(value, list) or not all(
        isinstance(tid, int) and not isinstance(tid, bool) and 0 < tid <= MAX_THREAD_ID for tid in value
    ):
        return None
    return frozenset(value)


def with_threads(
    entries: Sequence[OffCpuEntry], payload: object, source: str, offcpu_file: str = OFFCPU_FILE
) -> list[OffCpuEntry]:
    """``entries`` (the lines of ``offcpu_file``, in file order) with their threads from the thread file's
    ``payload`` (offcpu_threads.json's format); a payload that does not fit them is a CaptureFormatError
    naming ``source``."""
    sets = payload.get("sets") if isinstance(payload, dict) else None
    indexes = payload.get("lines") if isinstance(payload, dict) else None
    known = [_thread_set(tids) for tids in sets] if isinstance(sets, list) else [None]
    if (
        not isinstance(indexes, list)
        or len(indexes) != len(entries)
        or any(tids is None for tids in known)
        or not all(isinstance(i, int) and not isinstance(i, bool) and -1 <= i < len(known) for i in indexes)
    ):
        raise CaptureFormatError(
            f"{source}: expected {{\"sets\": [[thread id, ...], ...], \"lines\": [set index or -1 per line of "
            f"{offcpu_file} ({len(entries)})]}}; re-run the capture or delete the file (its threads: not measured)"
        )
    return [  # built whole: dataclasses.replace costs three times as much per line
        OffCpuEntry(e.cause, e.stack, e.blocked_ns, e.switches, e.context, None if index == -1 else known[index])
        for e, index in zip(entries, indexes)
    ]


OFFCPU_CONTEXTS_FILE = "offcpu_contexts.json"


def format_offcpu_contexts(by_interval: Mapping[int, Iterable[OffCpuEntry]], timeline_file: str) -> str:
    """offcpu_contexts.json: the blocked time of the entries with a context, per (context, line of the
    timeline text that ``by_interval`` formats to, 1-based): a stack is not repeated per task."""
    lines: dict[tuple[int, str, str], int] = {}
    parts: list[tuple[int, OffCpuEntry]] = []
    for interval, entries in sorted(by_interval.items()):
        kept = list(entries)
        for entry in merge_entries(kept, keep_contexts=False):
            if entry.blocked_ns > 0:
                lines[(interval, entry.cause, entry.stack)] = len(lines) + 1
        parts += [(interval, e) for e in merge_entries(kept) if e.context is not None and e.blocked_ns > 0]
    names = sorted({entry.context for _interval, entry in parts if entry.context is not None})
    ids = {name: index for index, name in enumerate(names)}
    rows = sorted(
        [ids[e.context], lines[(interval, e.cause, e.stack)], e.blocked_ns, e.switches]
        for interval, e in parts
        if e.context is not None
    )
    return json.dumps({"timeline": timeline_file, "contexts": names, "rows": rows}, separators=(",", ":")) + "\n"


def parse_offcpu_lines(lines: Iterable[str], source: str) -> Iterator[OffCpuEntry]:
    """Entries of offcpu.folded text; a malformed line is a CaptureFormatError ``source:line: ...``."""
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split(" ", 3)
        if len(fields) != 4 or not fields[3].strip():
            raise CaptureFormatError(
                f"{source}:{number}: expected 'cause blocked_ns switches stack', got {line[:80]!r}; "
                "fix or drop the line"
            )
        cause, blocked, switches, stack = fields
        if cause not in CAUSES:
            raise CaptureFormatError(
                f"{source}:{number}: unknown cause {cause[:40]!r} (one of {', '.join(CAUSES)}); fix or drop the line"
            )
        if not is_count(blocked) or not is_count(switches):
            raise CaptureFormatError(
                f"{source}:{number}: blocked_ns and switches must be whole numbers up to {MAX_COUNT}, "
                f"got {blocked[:30]!r} and {switches[:30]!r}; fix or drop the line"
            )
        yield OffCpuEntry(cause, stack, int(blocked), int(switches))


def read_offcpu_lines(path: Path) -> list[OffCpuEntry]:
    """offcpu.folded's lines as entries, in file order (what offcpu_threads.json's indexes refer to)."""
    with open_text(path, lenient=True) as handle:
        return list(parse_offcpu_lines(handle, str(path)))


def read_offcpu(path: Path) -> list[OffCpuEntry]:
    """A PID's off-CPU entries, merged per (cause, stack)."""
    return merge_entries(read_offcpu_lines(path))
