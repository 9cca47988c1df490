"""A HotSpot JVM's threads as the off-CPU tracer needs them: each thread id's JavaThread, and the vmStructs
offsets of what the JVM records about a thread's wait (its last Java frame, a contended monitor, Object.wait).

The thread list (ThreadsSMRSupport::_java_thread_list) is the target's memory: hostile input. Its length
is bounded, each entry read on its own (a thread exiting meanwhile is skipped), and nothing read here is
more than an address the BPF program reads again with bpf_probe_read_user.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import VMStructsError
from ..files import procread
from .codecache import KIND_NMETHOD, blob_kind, find_blob
from .hotspot import INTERPRETED_MARK, MethodNamer
from .vmstructs import THREAD_FIELDS, ProcessMemory, VMLayout

MAX_JAVA_THREADS = 1 << 16  # a JVM with more threads than this is garbage read as a thread list
_MAX_OFFSET = 1 << 16  # a JavaThread is a few KiB: a larger field offset is not HotSpot's
JAVA_INTERPRETED = 1 << 63  # offcpu_trace.c: a java_frame that is an interpreted frame's Method*


@dataclass(frozen=True)
class ThreadLayout:
    """Offsets from a JavaThread (and the thread list's address) for offcpu_trace.c's java_layout."""

    thread_list: int  # address of ThreadsSMRSupport::_java_thread_list
    list_length: int
    list_threads: int
    osthread: int
    thread_id: int  # in OSThread
    last_java_sp: int  # from the JavaThread: _anchor + JavaFrameAnchor::_last_Java_sp
    last_java_pc: int
    last_java_fp: int
    pending_monitor: int
    waiting_monitor: int
    interpreter: tuple[int, int]
    method_slot: int


def thread_layout(layout: VMLayout) -> ThreadLayout | None:
    """The offsets from the JVM's vmStructs; None when one is missing or absurd (another JDK's layout)."""
    fields = layout.fields
    osthread = fields.get(("JavaThread", "_osthread"), fields.get(("Thread", "_osthread")))
    wanted = THREAD_FIELDS - {("JavaThread", "_osthread"), ("Thread", "_osthread")}
    if osthread is None or not wanted <= fields.keys():
        return None
    anchor = fields[("JavaThread", "_anchor")]
    offsets = {
        "osthread": osthread,
        "thread_id": fields[("OSThread", "_thread_id")],
        "last_java_sp": anchor + fields[("JavaFrameAnchor", "_last_Java_sp")],
        "last_java_pc": anchor + fields[("JavaFrameAnchor", "_last_Java_pc")],
        "last_java_fp": anchor + fields[("JavaFrameAnchor", "_last_Java_fp")],
        "pending_monitor": fields[("JavaThread", "_current_pending_monitor")],
        "waiting_monitor": fields[("JavaThread", "_current_waiting_monitor")],
        "list_length": fields[("ThreadsList", "_length")],
        "list_threads": fields[("ThreadsList", "_threads")],
    }
    if any(not 0 <= value < _MAX_OFFSET for value in offsets.values()):
        return None
    return ThreadLayout(
        thread_list=fields[("ThreadsSMRSupport", "_java_thread_list")],
        interpreter=layout.interpreter,
        method_slot=layout.method_slot,
        **offsets,
    )


def read_java_threads(memory: ProcessMemory, layout: ThreadLayout) -> dict[int, int]:
    """Thread id (as the JVM's pid namespace sees it) -> JavaThread address, from the JVM's thread list.
    VMStructsError when the list itself cannot be read or is absurd."""
    try:
        threads_list = memory.u64(layout.thread_list)
        length = int.from_bytes(memory.read(threads_list + layout.list_length, 4), "little")
        if length > MAX_JAVA_THREADS:
            raise VMStructsError(f"pid {memory.pid}: a thread list of {length} threads: absurd vmStructs")
        array = memory.u64(threads_list + layout.list_threads) if length else 0
        raw = memory.read(array, 8 * length) if length else b""
    except OSError as exc:
        raise VMStructsError(f"pid {memory.pid}: reading the JVM's thread list failed ({exc})") from None
    threads: dict[int, int] = {}
    for index in range(length):
        java_thread = int.from_bytes(raw[8 * index : 8 * index + 8], "little")
        try:
            tid = memory.s32(memory.u64(java_thread + layout.osthread) + layout.thread_id)
        except OSError:
            continue  # the thread is going away: the next read of the list will not have it
        if tid > 0:
            threads[tid] = java_thread
    return threads


def host_tids(pid: int) -> dict[int, int] | None:
    """Thread ids as ``pid``'s own pid namespace sees them -> as ours does; None when the process shares
    our namespace (the ids are the same). A thread gone meanwhile is left out."""
    mapping: dict[int, int] = {}
    for task in procread.task_ids(pid) or ():  # within procread's caps: a target's threads and files
        ids = ((procread.status(pid, task=task) or {}).get("NSpid") or "").split()
        if len(ids) == 1:
            return None
        if len(ids) > 1 and ids[-1].isascii() and ids[-1].isdigit():
            mapping[int(ids[-1])] = task
    return mapping


def java_frame_name(namer: MethodNamer, value: int) -> str | None:
    """The last Java frame offcpu_trace.c stored (an interpreted frame's Method* with JAVA_INTERPRETED,
    else a pc in the code cache), named ``pkg.Class::method`` (interpreted: INTERPRETED_MARK); None when
    it cannot be named (stale, freed, a stub)."""
    if value == 0:
        return None
    if value & JAVA_INTERPRETED:
        name = namer.name(value & ~JAVA_INTERPRETED)
        return name + INTERPRETED_MARK if name is not None else None
    compiled = namer.compiled
    if compiled is None or not compiled.layout.low <= value < compiled.layout.high:
        return None
    try:
        blob = find_blob(namer.memory, compiled.layout, value)
        if blob is None or blob_kind(namer.memory, compiled.layout, blob) != KIND_NMETHOD:
            return None
        method = namer.memory.u64(blob + compiled.layout.method)
    except OSError:
        return None
    return namer.name(method)


# offcpu_trace.c's JAVA_* states (profiler/capture/offcpu.py has the same values)
_JAVA_IN_VM, _JAVA_MONITOR, _JAVA_WAIT = 1, 2, 3


def read_thread_view(memory: ProcessMemory, layout: ThreadLayout, java_thread: int) -> tuple[int, int]:
    """What offcpu_trace.c's java_view reads at a switch-out, read from user space for a thread that is
    blocked now: (java_state, java_frame). The target's memory: a failed read is (JAVA_IN_VM, 0)."""

    def u64(address: int) -> int:
        try:
            return memory.u64(address) if address else 0
        except OSError:
            return 0

    state = _JAVA_IN_VM
    if u64(java_thread + layout.pending_monitor):
        state = _JAVA_MONITOR
    elif u64(java_thread + layout.waiting_monitor):
        state = _JAVA_WAIT
    sp = u64(java_thread + layout.last_java_sp)
    if sp == 0:
        return state, 0
    pc = u64(java_thread + layout.last_java_pc) or u64(sp - 8)
    start, end = layout.interpreter
    if start <= pc < end:
        fp = u64(java_thread + layout.last_java_fp)
        method = u64(fp + layout.method_slot) if fp else 0
        return state, (method | JAVA_INTERPRETED) if method else 0
    return state, pc
