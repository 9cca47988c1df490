"""Off-CPU time per process, stack and cause from the scheduler's raw tracepoint (``profiler run --off-cpu``).

The kernel side (offcpu_trace.c) sums the blocked nanoseconds per (process, user stack, kernel stack,
reason, thread name); this module names the stacks after the window and gives each sum its cause
(profiler/capture/offcpu.py). No kprobe: only the sched_switch raw tracepoint and a stack map.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..bpf.compiler import bcc_error, compile_program
from ..bpf.defines import with_defines
from ..bpf.pidns import own_pid_namespace
from ..capture.offcpu import JAVA_NONE, OffCpuEntry, classify_cause, merge_entries
from ..errors import CapabilityError, PrivilegeError
from ..scope.threadnames import ThreadLabel
from ..symbols.procsyms import ProcessSymbols
from ..symbols.symbolize import KernelSymbols, fold_stack
from ..unwind.hotspot import MethodNamer
from .net import _KIND_STRUCT, VMLINUX_BTF, _Btf
from .offcpu_idle import IdleThread, WholeWindowWatch, idle_entries
from .offcpu_java import JavaThreadWatch
from .offcpu_timeline import OffCpuTimeline, OpenBlock, block_key, split_span, sums_of
from .offcpu_timeline import by_pid as blocks_by_pid

BPF_SOURCE = Path(__file__).parent / "offcpu_trace.c"
DEFAULT_MIN_BLOCK_MS = 1.0
# A thread's voluntary switch-outs per second that are followed whatever --off-cpu-sample-every says
# (offcpu_trace.c's EXACT_PER_EPOCH per 100 ms): threads that block rarely, for long, are measured exactly.
# A thread sampled at more than 1 in N (below) has none in the next 100 ms: they would be half its walks.
EXACT_SWITCH_OUTS_PER_S = 100
# Beyond those, the sampled switch-outs per thread and second aimed at (WALK_BUDGET_PER_EPOCH per 100 ms):
# a busier thread is sampled at more than 1 in --off-cpu-sample-every, so its stack walks stay bounded.
SAMPLED_SWITCH_OUTS_PER_S = 100
# The kernel's tick rate when its configuration cannot be read (the epochs are counted in jiffies: the
# program reads no clock source for them). Only the epoch's length depends on it, not the estimate's bias.
DEFAULT_KERNEL_HZ = 250
_KERNEL_CONFIGS = (Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}"))


def kernel_hz_of_config(text: str) -> int | None:
    """CONFIG_HZ of a kernel configuration's text; None when it has none (or a nonsense value)."""
    for line in text.splitlines():
        if line.startswith("CONFIG_HZ="):
            value = line.split("=", 1)[1].strip()
            return int(value) if value.isdigit() and 10 <= int(value) <= 10000 else None
    return None


def read_kernel_hz(paths: Sequence[Path] = _KERNEL_CONFIGS) -> int:
    """The running kernel's HZ from its configuration (/proc/config.gz, /boot/config-RELEASE), else
    DEFAULT_KERNEL_HZ."""
    import gzip

    for path in paths:
        try:
            raw = path.read_bytes()[: 1 << 24]
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        hz = kernel_hz_of_config(text)
        if hz is not None:
            return hz
    return DEFAULT_KERNEL_HZ


@dataclass(frozen=True)
class SwitchLayout:
    """What offcpu_trace.c needs from the kernel's BTF: task_struct.pid's byte offset and the number
    of sched_switch's tracepoint arguments (4 since Linux 5.18: preempt, prev, next, prev_state)."""

    task_pid_offset: int
    switch_args: int | None


def read_switch_layout(path: Path = VMLINUX_BTF) -> SwitchLayout | None:
    """The layout from the kernel's BTF; None when it is missing or does not describe task_struct.pid."""
    try:
        btf = _Btf(path.read_bytes())
        task = btf.find(_KIND_STRUCT, "task_struct")
        offset = btf.member_bit_offset(task, "pid") if task is not None else None
        params = btf.typedef_proto_params("btf_trace_sched_switch")
    except (OSError, ValueError, IndexError):
        return None
    if offset is None:
        return None
    return SwitchLayout(task_pid_offset=offset // 8, switch_args=params - 1 if params else None)


def build_bpf_text(
    source: str, layout: SwitchLayout | None, min_block_ns: int, sample_every: int = 1, hz: int = DEFAULT_KERNEL_HZ
) -> str:
    """The C program: defines first, then offcpu_trace.c; ``hz`` the kernel's tick rate (epochs in jiffies)."""
    if layout is None or layout.switch_args != 4:
        raise CapabilityError(
            f"{VMLINUX_BTF}: no task_struct.pid or no 4-argument sched_switch tracepoint in BTF; "
            "profiler run --off-cpu needs kernel >= 5.18 with BTF; run without --off-cpu"
        )
    defines = {
        "NEXT_PID_OFF": layout.task_pid_offset,
        "MIN_BLOCK_NS": int(min_block_ns),
        "SAMPLE_EVERY": int(sample_every),
        "EXACT_PER_EPOCH": EXACT_SWITCH_OUTS_PER_S // 10,
        "WALK_BUDGET_PER_EPOCH": SAMPLED_SWITCH_OUTS_PER_S // 10,
        "EPOCH_JIFFIES": max(int(hz) // 10, 1),
    }
    return with_defines(defines, source)


@dataclass(frozen=True)
class RawBlock:
    """One sum of the kernel's map (or one block still open at the end of the window)."""

    tgid: int
    user_stack_id: int
    kernel_stack_id: int
    reason: int
    comm: str
    blocked_ns: int
    switches: int
    java_state: int = JAVA_NONE  # what the JVM said of the thread (JAVA_*)
    java_frame: int = 0  # its last Java frame as offcpu_trace.c stored it (0: none)
    tid: int = 0  # the thread (0: not known)
    walked_stack: int = 0  # the walker's user stack (offcpu_walked's key) when user_stack_id is STACK_WALKED


# (kind, context) of a thread: the root frame its stacks get and its full name when that names a unit of work
ThreadKind = tuple[str, "str | None"]
# The sampler's thread namer: (tgid, tid, monotonic ns, comm) -> its label, None without thread names
ThreadLabeler = Callable[[int, int, int, bytes], "ThreadLabel | None"]


def label_threads(
    threads: Iterable[tuple[int, int, str]], time_ns: int, thread_label: ThreadLabeler | None
) -> dict[tuple[int, int, str], ThreadKind]:
    """(kind, context) of each (tgid, tid, comm) at ``time_ns``, as the on-CPU samples name their threads
    (profiler/scope/threadnames.py); the comm and no context where the thread's full name is not known."""
    labels: dict[tuple[int, int, str], ThreadKind] = {}
    for key in threads:
        if key in labels:
            continue
        tgid, tid, comm = key
        label = thread_label(tgid, tid, time_ns, comm.encode("utf-8", "replace")) if thread_label and tid else None
        labels[key] = (label.kind, label.context) if label is not None else (comm, None)
    return labels


def open_blocks(pending: Iterable[RawBlock], end_ns: int, min_block_ns: int) -> list[RawBlock]:
    """Threads still switched out when the window ended: ``pending`` holds their switch-out time in
    ``blocked_ns`` and its weight in ``switches`` (the switch-outs it stands for; 0 read as 1); each
    counts up to ``end_ns``, times its weight, if that is at least the minimum."""
    closed = []
    for block in pending:
        blocked, weight = end_ns - block.blocked_ns, max(block.switches, 1)
        if blocked >= min_block_ns:
            closed.append(replace(block, blocked_ns=blocked * weight, switches=weight))
    return closed


# user_stack_id of a block whose user stack the walker took (offcpu_trace.c): its frames are walked_stack's
STACK_WALKED = -100
# A stack of the walker's values, leaf first, with the JVM's generation of names it was walked in (None: unknown)
WalkedStack = tuple[tuple[int, ...], "int | None"]


# Kernel frames of the tracing itself, at the leaf of every kernel stack taken in the tracepoint.
_TRACING_FRAMES = ("bpf_prog_", "bpf_trace_run")


def without_tracing_frames(kernel_leaf_first: list[str]) -> list[str]:
    """The kernel frames from the scheduler down, without the BPF program's own frames at the leaf."""
    start = 0
    while start < len(kernel_leaf_first) and kernel_leaf_first[start].startswith(_TRACING_FRAMES):
        start += 1
    return kernel_leaf_first[start:]


# The outermost frames of a thread (glibc's and HotSpot's thread starts): a walk that reached one is whole.
_THREAD_ROOTS = ("start_thread", "clone3", "__clone", "clone", "_start", "thread_native_entry")


def _whole(user_leaf_first: Sequence[str]) -> bool:
    return bool(user_leaf_first) and user_leaf_first[-1].startswith(_THREAD_ROOTS)


def name_blocks(
    blocks: Iterable[RawBlock],
    stack_of: Callable[[int], tuple[int, ...] | None],
    user_name: Callable[[int], str],
    kernel_name: Callable[[int], str],
    java_name: Callable[[int], str | None] = lambda _frame: None,
    thread_of: Callable[[RawBlock], ThreadKind] = lambda block: (block.comm, None),
    walked_names: Callable[[int], list[str] | None] = lambda _walked: None,
) -> list[OffCpuEntry]:
    """Entries of one process: each block's stacks named (None from ``stack_of``: lost) and its cause; the
    root is its thread's kind (``thread_of``), the entry's context its full name when it names a unit of work.

    A Java thread's last Java frame (named by ``java_name``) goes below the walked user frames, as their
    caller, when the walk was cut: the frame-pointer walk of a blocked JVM thread usually stops in glibc,
    far leafward of it. A walk that reached the thread's start already holds the Java frames. A block whose
    user stack the walker took (STACK_WALKED) is named by ``walked_names`` (None: lost)."""
    entries = []
    for block in blocks:
        kernel = stack_of(block.kernel_stack_id)
        if block.user_stack_id == STACK_WALKED:
            user_frames = walked_names(block.walked_stack)
        else:
            user = stack_of(block.user_stack_id)
            user_frames = [user_name(a) for a in user] if user is not None else None
        java_frame = java_name(block.java_frame) if block.java_frame else None
        if java_frame is not None and user_frames is not None and not _whole(user_frames):
            user_frames.append(java_frame)
        kind, context = thread_of(block)
        stack = fold_stack(
            kind,
            user_frames,
            without_tracing_frames([kernel_name(a) for a in kernel]) if kernel is not None else None,
        )
        cause = classify_cause(block.reason, stack, block.java_state, java_frame)
        threads = frozenset((block.tid,)) if block.tid else None  # the union per task needs the ids
        entries.append(OffCpuEntry(cause, stack, block.blocked_ns, block.switches, context, threads))
    return merge_entries(entries)


def labels_of(labels: Mapping[tuple[int, int, str], ThreadKind]) -> Callable[[RawBlock], ThreadKind]:
    """``name_blocks``' ``thread_of`` from the labels of ``label_threads``."""
    return lambda block: labels[(block.tgid, block.tid, block.comm)]


def _comm(raw: Any) -> str:
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")


def _frame_namer(symbols: Any) -> Callable[[int], str]:
    return lambda address: str(symbols.resolve(address).name)


def _stack_reader(stacks: Any) -> Callable[[int], tuple[int, ...] | None]:
    """The addresses of a stack id of the stack map (None: lost or not recorded), each id read once."""
    cache: dict[int, tuple[int, ...] | None] = {}

    def stack_of(stack_id: int) -> tuple[int, ...] | None:
        if stack_id < 0:
            return None
        if stack_id not in cache:
            try:
                cache[stack_id] = tuple(int(a) for a in stacks[stacks.Key(stack_id)].ip if a)
            except KeyError:
                cache[stack_id] = None
        return cache[stack_id]

    return stack_of


def walked_reader(walked: Any) -> Callable[[int], WalkedStack | None]:
    """The values of a walked stack (offcpu_walked's key), in walk order (None: not stored), each read once."""
    from ..capture.stackstore import walk_order
    from .program import OFFCPU_LEAF_SLOTS, OFFCPU_ROOT_SLOTS

    cache: dict[int, WalkedStack | None] = {}

    def stack_of(key: int) -> WalkedStack | None:
        if key not in cache:
            try:
                record = walked[walked.Key(key)]
            except KeyError:
                cache[key] = None
                return None
            walked_frames = int(record.walked)
            stored = min(walked_frames, OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS)
            raw = b"".join(int(record.frames[i]).to_bytes(8, "little") for i in range(stored))
            ordered = walk_order(raw, walked_frames, OFFCPU_LEAF_SLOTS, OFFCPU_ROOT_SLOTS)
            values = tuple(int.from_bytes(ordered[i : i + 8], "little") for i in range(0, len(ordered), 8))
            unloads = int(record.jvm_unloads)
            cache[key] = (values, None if unloads == (1 << 64) - 1 else unloads)
        return cache[key]

    return stack_of


def walked_namer(
    stack_of: Callable[[int], WalkedStack | None], symbols: Any, kernel: Any, methods: Any, java_process: bool
) -> Callable[[int], list[str] | None]:
    """Names of one process's walked stacks by the on-CPU samples' folder (StackFolder: native symbols, the
    JVM's interpreted and compiled frames with their inlined methods, by the generation each was walked in)."""
    from ..symbols.symbolize import StackFolder

    folder = StackFolder(symbols, kernel, 1 << 16, java_process, walker=True, methods=methods)

    def names(key: int) -> list[str] | None:
        walked = stack_of(key)
        if walked is None:
            return None
        values, generation = walked
        if generation is not None:
            folder.use_generation(generation)
        return folder.walked_names(values)

    return names


def default_symbols(pid: int) -> ProcessSymbols:
    """The process's symbols with its latest perf map (the sampler refreshed it at collection)."""
    from ..symbols.perfmap import read_perf_map

    symbols = ProcessSymbols(pid)
    symbols.set_perf_map(read_perf_map(pid))
    return symbols


class OffCpuTracer:
    """Blocked time per PID, stack and cause from sched_switch.

    Lifecycle like NetTracer: ``start()`` (compile + attach, before the window), ``add_pid()`` any time,
    ``stop()`` (detach, close the blocks still open), ``collect()``, ``close()``.
    """

    def __init__(
        self,
        min_block_ms: float = DEFAULT_MIN_BLOCK_MS,
        stack_entries: int = 32768,
        sample_every: int = 1,
        borrow_namer: Callable[[int], MethodNamer | None] | None = None,
        thread_label: ThreadLabeler | None = None,
        walker: Callable[[], Any] | None = None,
    ) -> None:
        self.min_block_ns = int(min_block_ms * 1e6)
        self.sample_every = sample_every  # beyond EXACT_SWITCH_OUTS_PER_S: one switch-out in N is followed
        self.stack_entries = stack_entries
        self._bpf: Any = None
        # the sampler's program with this one compiled in (StackSampler.offcpu_program; None: load our own)
        self._walker = walker
        self._shared = False  # self._bpf is the sampler's: blocked stacks by the walker, freed by the sampler
        self._walked_reader: Callable[[int], WalkedStack | None] | None = None
        self._attached = False
        self._pids: set[int] = set()
        self._pending: list[RawBlock] = []
        self._warnings: list[str] = []
        self._lock = threading.Lock()
        self._java: JavaThreadWatch | None = None  # the JVMs' own word on their threads' waits
        self._borrow_namer = borrow_namer  # the sampler's JVM namers: vmStructs read once per JVM, not twice
        self._thread_label = thread_label  # the sampler's thread names: blocks get the samples' kinds and contexts
        self._tick_labels: dict[int, dict[tuple[int, int, str], ThreadKind]] = {}  # interval -> names at its end
        self._end_ns = 0  # when stop() closed the window: the threads' names then name the window's blocks
        self._whole = WholeWindowWatch()  # threads with no switch in the window (blocked all of it)
        self._idle: dict[int, list[IdleThread]] = {}
        self._idle_end_ns = 0  # when the idle threads were last seen not to have run
        self._timeline: OffCpuTimeline | None = None  # snapshots at interval ends (tick), for the timeline
        self._ticks: list[tuple[int, int]] = []  # (interval, monotonic ns of its end), for the idle threads
        # the kernel's names for every checkpoint's copy and collect(): bcc's table (~18 MB, ~0.08 CPU s to
        # load) is freed after each naming and loaded again only for an address not named before
        self._kernel: KernelSymbols | None = None
        # after collect(), with ticks: interval -> PID -> entries (pids/<pid>/offcpu_timeline.folded)
        self.interval_entries: dict[int, dict[int, list[OffCpuEntry]]] = {}

    def bpf_text(self) -> str:
        """The program: the defines of this tracer and this kernel, then offcpu_trace.c."""
        source = BPF_SOURCE.read_text(encoding="utf-8")
        text = build_bpf_text(source, read_switch_layout(), self.min_block_ns, self.sample_every, read_kernel_hz())
        return f"#define STACK_ENTRIES {self.stack_entries}\n" + text

    def start(self) -> str:
        if self._bpf is not None:
            raise RuntimeError("OffCpuTracer.start() called twice")
        if os.geteuid() != 0:
            raise PrivilegeError("profiler run --off-cpu: eBPF needs root (or CAP_BPF and CAP_PERFMON); run with sudo")
        namespace = own_pid_namespace()
        if namespace is not None and not namespace.initial:
            # the switched-in thread is read from its task_struct: an id of the initial namespace, which
            # the namespace's ids (profiler/bpf/pidns.py) of the switched-out one would never meet
            raise CapabilityError(
                "profiler run --off-cpu: not available in a PID namespace of its own (the agent's ids are that "
                "namespace's, sched_switch names the next thread in the initial one); run without --off-cpu "
                "or start the agent in the initial PID namespace"
            )
        try:
            from bcc import BPF
        except ImportError:
            raise CapabilityError(
                "profiler/sampling/offcpu.py: cannot import bcc; install python3-bpfcc (scripts/setup.sh)"
            ) from None
        shared = self._walker() if self._walker is not None else None
        bpf = shared if shared is not None else self._load(BPF)
        self._shared = shared is not None
        for table in (b"target_tgids", b"scope_bits", b"java_threads", b"java_layouts", b"switched_out", b"blocked"):
            bpf[table]  # bcc builds each table object once: here, before the JVM watch's thread uses them
        self._bpf = bpf
        self._attached = True
        self._java = JavaThreadWatch(bpf, borrow=self._borrow_namer)
        with self._lock:
            for pid in sorted(self._pids):
                self._write_pid(pid)
        self._java.start()
        return "sched_switch"

    def _load(self, bpf_class: Any) -> Any:
        """Compile, load and attach (bcc attaches RAW_TRACEPOINT_PROBE programs as it loads them)."""
        try:
            return compile_program(bpf_class, self.bpf_text())
        except Exception as exc:  # noqa: BLE001 - bcc raises Exception for compile and attach failures alike
            detail = bcc_error(exc)
        raise CapabilityError(
            f"profiler run --off-cpu: cannot attach to the sched_switch raw tracepoint ({detail}); "
            "run without --off-cpu"
        )

    def add_pid(self, pid: int) -> None:
        """Trace ``pid``'s threads from now on; may be called before or after start()."""
        with self._lock:
            if pid in self._pids:
                return
            self._pids.add(pid)
            if self._bpf is not None:
                self._write_pid(pid)

    def pid_exited(self, pid: int) -> None:
        """Stop following ``pid`` (its sums stay): a later process given the same pid is not in the scope."""
        with self._lock:
            if self._bpf is not None:
                self._set_scope_bit(pid, False)
                try:
                    del self._bpf[b"target_tgids"][ctypes.c_uint32(pid)]
                except KeyError:
                    pass
            if self._java is not None:
                self._java.detach(pid)
            self._whole.forget(pid)

    def _write_pid(self, pid: int) -> None:
        # The threads' marks first: one that runs after its mark is traced from its next switch-out, one that
        # does not run again is blocked all window (never both: its mark would differ at the end).
        self._whole.begin(pid, time.monotonic_ns())
        if self._java is not None:  # before the scope: the process's first blocks have their JVM's view
            self._java.attach(pid)
        self._bpf[b"target_tgids"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        self._set_scope_bit(pid, True)

    def _set_scope_bit(self, pid: int, on: bool) -> None:
        """``pid``'s bit in scope_bits, the bitmap the program's hot path reads (only user space writes
        it, under the lock)."""
        words = self._bpf[b"scope_bits"]
        key = words.Key(pid >> 6)
        value = int(words[key].value)
        bit = 1 << (pid & 63)
        words[key] = words.Leaf(value | bit if on else value & ~bit)

    def _switched_out(self) -> list[tuple[int, RawBlock]]:
        """(thread id, block) of the threads switched out now; ``blocked_ns`` holds the switch-out time and
        ``switches`` its weight (the switch-outs a followed one stands for)."""
        table = self._bpf[b"switched_out"]
        found = []
        for key in list(table.keys()):
            try:
                v = table[key]
            except KeyError:  # switched in meanwhile
                continue
            found.append((int(key.value), RawBlock(
                int(v.tgid), int(v.user_stack_id), int(v.kernel_stack_id), int(v.reason), _comm(v.comm),
                int(v.time_ns), int(v.weight), int(v.java_state), int(v.java_frame), int(key.value),
                int(v.walked_stack),
            )))
        return found

    def tick(self, interval: int) -> None:
        """Interval ``interval`` of the window ends: snapshot the sums, so that collect() splits them by
        interval too (profiler/sampling/offcpu_timeline.py)."""
        if self._bpf is None or not self._attached:
            return
        if self._timeline is None:
            self._timeline = OffCpuTimeline(self.min_block_ns)
        now_ns = time.monotonic_ns()
        opened = [
            OpenBlock(tid, block.blocked_ns, block_key(block), max(block.switches, 1))
            for tid, block in self._switched_out()
        ]
        sums = sums_of(self._summed())
        self._timeline.snapshot(interval, now_ns, sums, opened)
        self._ticks.append((interval, now_ns))
        # the names now: a thread renamed per unit of work (Spark) keeps the interval's blocks under this one
        threads = [(b.tgid, b.tid, b.comm) for b in (*sums, *(o.key for o in opened))]
        self._tick_labels[interval] = label_threads(threads, now_ns, self._thread_label)

    def stop(self) -> None:
        """Detach; the threads still switched out count up to now (their block began in the window)."""
        if self._bpf is None or not self._attached:
            return
        if self._java is not None:
            self._java.stop()
        java = self._java
        self._idle_end_ns = time.monotonic_ns()
        self._idle = self._whole.finish(  # before the detach: a thread woken meanwhile is traced, not lost
            self._idle_end_ns, self.min_block_ns,
            java.view_for if java is not None else (lambda _pid: lambda _tid: (JAVA_NONE, 0)),
        )
        try:
            self._bpf.detach_raw_tracepoint(tp=b"sched_switch")
        except Exception:  # noqa: BLE001 - already gone: nothing to detach
            pass
        self._attached = False
        end_ns = self._end_ns = time.monotonic_ns()  # bpf_ktime_get_ns is CLOCK_MONOTONIC
        pending = [block for _tid, block in self._switched_out()]
        self._pending = open_blocks(pending, end_ns, self.min_block_ns)

    def _summed(self) -> list[RawBlock]:
        """The kernel's sums so far (each followed switch-out already weighted in the kernel)."""
        return [
            RawBlock(int(key.tgid), int(key.user_stack_id), int(key.kernel_stack_id), int(key.reason),
                     _comm(key.comm), int(value.blocked_ns), int(value.switches), int(key.java_state),
                     int(key.java_frame), int(key.tid), int(key.walked_stack))
            for key, value in self._bpf[b"blocked"].items()
        ]

    def read_blocks(self) -> dict[int, list[RawBlock]]:
        """The kernel's sums and the blocks closed at stop(), per PID: estimates of all switch-outs (a
        sampled one was weighted in the kernel by the switch-outs it stands for)."""
        if self._bpf is None:
            return {}
        return blocks_by_pid([*self._summed(), *self._pending])

    def collect(self, symbols_for: Callable[[int], Any] = default_symbols) -> dict[int, list[OffCpuEntry]]:
        """Entries per added PID (empty when it never blocked long enough); names the stacks now."""
        if self._attached:
            self.stop()
        by_pid = self.read_blocks()
        result: dict[int, list[OffCpuEntry]] = {pid: [] for pid in sorted(self._pids)}
        if self._bpf is None:
            return result
        stack_of = _stack_reader(self._bpf[b"offcpu_stacks"])
        per_interval: dict[int, dict[int, list[RawBlock]]] = {}  # interval -> PID -> blocks
        if self._timeline is not None:
            final = [block for blocks in by_pid.values() for block in blocks]
            finished = self._timeline.finish(self._timeline.last_interval, final)
            per_interval = {interval: blocks_by_pid(blocks) for interval, blocks in finished.items()}
        kernel = self._kernel_symbols()
        try:
            for pid, blocks in sorted(by_pid.items()):
                symbols = symbols_for(pid)
                try:
                    names = self._namers(pid, stack_of, symbols, kernel)
                    walked = self._walked_names(pid, symbols, kernel)
                    result[pid] = name_blocks(blocks, *names, self._thread_of(blocks), walked)
                    for interval, interval_blocks in per_interval.items():
                        mine = interval_blocks.get(pid)
                        if mine:
                            named = name_blocks(mine, *names, self._thread_of(mine, interval), walked)
                            self.interval_entries.setdefault(interval, {})[pid] = named
                finally:
                    symbols.close()
            self._add_idle(result)
        finally:
            kernel.release_table()
        self._check_drops(sum(e.blocked_ns for entries in result.values() for e in entries))
        return result

    def _namers(self, pid: int, stack_of: Callable[[int], tuple[int, ...] | None], symbols: Any, kernel: Any) -> tuple[
        Callable[[int], tuple[int, ...] | None], Callable[[int], str], Callable[[int], str], Callable[[int], str | None]
    ]:
        """``name_blocks``' namers for ``pid``: its stacks, user and kernel frames, and its JVM's last Java frames."""
        java_name = self._java.namer_for(pid) if self._java is not None else (lambda _frame: None)
        return stack_of, _frame_namer(symbols), kernel.resolve, java_name

    def _walked_names(self, pid: int, symbols: Any, kernel: Any) -> Callable[[int], list[str] | None]:
        """``name_blocks``' ``walked_names`` for ``pid``: its walked stacks named as its on-CPU samples are."""
        if not self._shared:
            return lambda _walked: None
        methods = self._borrow_namer(pid) if self._borrow_namer is not None else None
        return walked_namer(self._walked_of(), symbols, kernel, methods, methods is not None)

    def _walked_of(self) -> Callable[[int], WalkedStack | None]:
        if self._walked_reader is None:
            self._walked_reader = walked_reader(self._bpf[b"offcpu_walked"])
        return self._walked_reader

    def checkpoint_entries(self, symbols_for: Callable[[int], Any] = default_symbols) -> dict[int, list[OffCpuEntry]]:
        """The kernel's sums so far per PID, named now as collect() names them (threads by their names now),
        while the tracer stays attached: what the checkpoint journal keeps of a run that may be killed.
        The blocks still open and the threads blocked all window are left out (their end is not known yet)."""
        if self._bpf is None or not self._attached:
            return {}
        now_ns = time.monotonic_ns()
        by_pid = blocks_by_pid(self._summed())
        stack_of = _stack_reader(self._bpf[b"offcpu_stacks"])
        result: dict[int, list[OffCpuEntry]] = {}
        kernel = self._kernel_symbols()
        try:
            for pid, blocks in sorted(by_pid.items()):
                symbols = symbols_for(pid)  # anew each time: the perf map and the JIT's code move on
                try:
                    labels = label_threads([(b.tgid, b.tid, b.comm) for b in blocks], now_ns, self._thread_label)
                    namers = self._namers(pid, stack_of, symbols, kernel)
                    walked = self._walked_names(pid, symbols, kernel)
                    result[pid] = name_blocks(blocks, *namers, labels_of(labels), walked)
                finally:
                    symbols.close()
        finally:
            kernel.release_table()
        return result

    def _kernel_symbols(self) -> KernelSymbols:
        """The tracer's kernel names (one table of names for the checkpoints and collect())."""
        if self._kernel is None:
            self._kernel = KernelSymbols()
        return self._kernel

    def _thread_of(self, blocks: Sequence[RawBlock], interval: int | None = None) -> Callable[[RawBlock], ThreadKind]:
        """The kind and context of each block's thread: by its name at the end of ``interval`` (as that
        interval's snapshot saw it), else at the window's end."""
        at_tick = self._tick_labels.get(interval, {}) if interval is not None else {}
        missing = [(b.tgid, b.tid, b.comm) for b in blocks if (b.tgid, b.tid, b.comm) not in at_tick]
        labels = {**label_threads(missing, self._end_ns, self._thread_label), **at_tick}
        return labels_of(labels)

    def _add_idle(self, result: dict[int, list[OffCpuEntry]]) -> None:
        """The whole-window blocks (not sampled, not scaled) into ``result`` and, split where the intervals
        ended, into the timeline's entries."""
        last = self._timeline.last_interval if self._timeline is not None else -1
        for pid, threads in sorted(self._idle.items()):
            java_name = self._java.namer_for(pid) if self._java is not None else (lambda _frame: None)
            # a thread that never ran in the window was not renamed in it: its name at the end holds throughout
            labels = label_threads([(pid, t.tid, t.comm) for t in threads], self._end_ns, self._thread_label)
            result[pid] = merge_entries([*result.get(pid, []), *idle_entries(threads, java_name, labels, pid)])
            if last < 0:
                continue
            parts: dict[int, list[IdleThread]] = {}
            for thread in threads:
                start_ns = self._idle_end_ns - thread.blocked_ns
                for interval, ns in split_span(start_ns, self._idle_end_ns, self._ticks, last).items():
                    parts.setdefault(interval, []).append(replace(thread, blocked_ns=ns))
            for interval, interval_threads in parts.items():
                entries = self.interval_entries.setdefault(interval, {})
                idle = idle_entries(interval_threads, java_name, labels, pid)
                entries[pid] = merge_entries([*entries.get(pid, []), *idle])

    def _check_drops(self, summed_ns: int) -> None:
        short, short_ns = self.short_blocks
        if short_ns > 0.1 * summed_ns and short_ns > 1e9:
            self._warnings.append(
                f"off-cpu: {short} blocks shorter than {self.min_block_ns / 1e6:g} ms ({short_ns / 1e9:.1f} s, "
                f"more than a tenth of the {summed_ns / 1e9:.1f} s summed) were not summed; "
                "lower --off-cpu-min-block to see them"
            )
        dropped = self._bpf[b"offcpu_dropped"]
        lost_out, lost_blocks, lost_ns = int(dropped[0].value), int(dropped[1].value), int(dropped[2].value)
        if lost_out or lost_blocks:
            self._warnings.append(
                f"off-cpu: {lost_out} switch-outs not remembered and {lost_blocks} blocks "
                f"({lost_ns / 1e9:.3f} s) not summed (maps full); raise --off-cpu-min-block to keep fewer"
            )

    @property
    def short_blocks(self) -> tuple[int, int]:
        """(count, nanoseconds) of the blocks shorter than the minimum, which were not summed."""
        if self._bpf is None:
            return 0, 0
        dropped = self._bpf[b"offcpu_dropped"]
        return int(dropped[3].value), int(dropped[4].value)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings) + (list(self._java.errors) if self._java is not None else [])

    @property
    def prog_ids(self) -> list[int]:
        from .program import bpf_prog_ids

        return bpf_prog_ids(self._bpf) if self._bpf is not None and not self._shared else []

    def close(self) -> None:
        """Detach and unload; safe to call more than once."""
        if self._kernel is not None:
            self._kernel.close()
            self._kernel = None
        if self._java is not None:
            self._java.close()
            self._java = None
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            if self._shared and self._attached:
                try:
                    bpf.detach_raw_tracepoint(tp=b"sched_switch")
                except Exception:  # noqa: BLE001 - already gone: nothing to detach
                    pass
            self._attached = False
            if not self._shared:  # the sampler's program is the sampler's to free (after this close)
                bpf.cleanup()

    def __enter__(self) -> OffCpuTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
