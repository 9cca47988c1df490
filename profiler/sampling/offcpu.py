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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..bpf.compiler import compile_program
from ..capture.offcpu import JAVA_NONE, OffCpuEntry, classify_cause, merge_entries
from ..errors import CapabilityError, PrivilegeError
from ..symbols.symbolize import KernelSymbols, ProcessSymbols, fold_stack
from .net import _KIND_STRUCT, VMLINUX_BTF, _Btf
from .offcpu_java import JavaThreadWatch
from .offcpu_timeline import OffCpuTimeline, OpenBlock, block_key, sums_of

BPF_SOURCE = Path(__file__).parent / "offcpu_trace.c"
DEFAULT_MIN_BLOCK_MS = 1.0


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


def build_bpf_text(source: str, layout: SwitchLayout | None, min_block_ns: int, sample_every: int = 1) -> str:
    """The C program: defines first, then offcpu_trace.c."""
    if layout is None or layout.switch_args != 4:
        raise CapabilityError(
            f"{VMLINUX_BTF}: no task_struct.pid or no 4-argument sched_switch tracepoint in BTF; "
            "profiler run --off-cpu needs kernel >= 5.18 with BTF; run without --off-cpu"
        )
    defines = [
        f"#define NEXT_PID_OFF {layout.task_pid_offset}",
        f"#define MIN_BLOCK_NS {int(min_block_ns)}",
        f"#define SAMPLE_EVERY {int(sample_every)}",
    ]
    return "\n".join(defines) + "\n" + source


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


def open_blocks(pending: Iterable[RawBlock], end_ns: int, min_block_ns: int) -> list[RawBlock]:
    """Threads still switched out when the window ended: ``pending`` holds their switch-out time in
    ``blocked_ns``; each counts up to ``end_ns`` if that is at least the minimum."""
    closed = []
    for block in pending:
        blocked = end_ns - block.blocked_ns
        if blocked >= min_block_ns:
            closed.append(replace(block, blocked_ns=blocked, switches=1))
    return closed


# Kernel frames of the tracing itself, at the leaf of every kernel stack taken in the tracepoint.
_TRACING_FRAMES = ("bpf_prog_", "bpf_trace_run")


def without_tracing_frames(kernel_leaf_first: list[str]) -> list[str]:
    """The kernel frames from the scheduler down, without the BPF program's own frames at the leaf."""
    start = 0
    while start < len(kernel_leaf_first) and kernel_leaf_first[start].startswith(_TRACING_FRAMES):
        start += 1
    return kernel_leaf_first[start:]


def scaled(blocks: Iterable[RawBlock], sample_every: int) -> list[RawBlock]:
    """Sums of one switch-out in ``sample_every`` as estimates of all: time and switches × ``sample_every``."""
    if sample_every <= 1:
        return list(blocks)
    return [replace(b, blocked_ns=b.blocked_ns * sample_every, switches=b.switches * sample_every) for b in blocks]


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
) -> list[OffCpuEntry]:
    """Entries of one process: each block's stacks named (None from ``stack_of``: lost) and its cause.

    A Java thread's last Java frame (named by ``java_name``) goes below the walked user frames, as their
    caller, when the walk was cut: the frame-pointer walk of a blocked JVM thread usually stops in glibc,
    far leafward of it. A walk that reached the thread's start already holds the Java frames."""
    entries = []
    for block in blocks:
        user = stack_of(block.user_stack_id)
        kernel = stack_of(block.kernel_stack_id)
        user_frames = [user_name(a) for a in user] if user is not None else None
        java_frame = java_name(block.java_frame) if block.java_frame else None
        if java_frame is not None and user_frames is not None and not _whole(user_frames):
            user_frames.append(java_frame)
        stack = fold_stack(
            block.comm,
            user_frames,
            without_tracing_frames([kernel_name(a) for a in kernel]) if kernel is not None else None,
        )
        cause = classify_cause(block.reason, stack, block.java_state, java_frame)
        entries.append(OffCpuEntry(cause, stack, block.blocked_ns, block.switches))
    return merge_entries(entries)


def _comm(raw: Any) -> str:
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")


def _frame_namer(symbols: Any) -> Callable[[int], str]:
    return lambda address: str(symbols.resolve(address).name)


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
        self, min_block_ms: float = DEFAULT_MIN_BLOCK_MS, stack_entries: int = 32768, sample_every: int = 1
    ) -> None:
        self.min_block_ns = int(min_block_ms * 1e6)
        self.sample_every = sample_every  # one switch-out in this many is followed; sums are scaled back
        self.stack_entries = stack_entries
        self._bpf: Any = None
        self._attached = False
        self._pids: set[int] = set()
        self._pending: list[RawBlock] = []
        self._warnings: list[str] = []
        self._lock = threading.Lock()
        self._java: JavaThreadWatch | None = None  # the JVMs' own word on their threads' waits
        self._timeline: OffCpuTimeline | None = None  # snapshots at interval ends (tick), for the timeline
        # after collect(), with ticks: interval -> PID -> entries (pids/<pid>/offcpu_timeline.folded)
        self.interval_entries: dict[int, dict[int, list[OffCpuEntry]]] = {}

    def bpf_text(self) -> str:
        source = BPF_SOURCE.read_text(encoding="utf-8")
        text = build_bpf_text(source, read_switch_layout(), self.min_block_ns, self.sample_every)
        return f"#define STACK_ENTRIES {self.stack_entries}\n" + text

    def start(self) -> str:
        if self._bpf is not None:
            raise RuntimeError("OffCpuTracer.start() called twice")
        if os.geteuid() != 0:
            raise PrivilegeError("profiler run --off-cpu: eBPF needs root (or CAP_BPF and CAP_PERFMON); run with sudo")
        try:
            from bcc import BPF
        except ImportError:
            raise CapabilityError(
                "profiler/sampling/offcpu.py: cannot import bcc; install python3-bpfcc (scripts/setup.sh)"
            ) from None
        text = self.bpf_text()
        bpf = None
        try:
            bpf = compile_program(BPF, text)  # bcc attaches RAW_TRACEPOINT_PROBE programs as it loads them
        except Exception as exc:  # noqa: BLE001 - bcc raises Exception for compile and attach failures alike
            if bpf is not None:
                bpf.cleanup()
            detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise CapabilityError(
                f"profiler run --off-cpu: cannot attach to the sched_switch raw tracepoint ({detail}); "
                "run without --off-cpu"
            ) from None
        self._bpf = bpf
        self._attached = True
        self._java = JavaThreadWatch(bpf)
        with self._lock:
            for pid in sorted(self._pids):
                self._write_pid(pid)
        self._java.start()
        return "sched_switch"

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
                try:
                    del self._bpf[b"target_tgids"][ctypes.c_uint32(pid)]
                except KeyError:
                    pass
            if self._java is not None:
                self._java.detach(pid)

    def _write_pid(self, pid: int) -> None:
        if self._java is not None:  # first: the process's first blocks already have their JVM's view
            self._java.attach(pid)
        self._bpf[b"target_tgids"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def _switched_out(self) -> list[tuple[int, RawBlock]]:
        """(thread id, block) of the threads switched out now; ``blocked_ns`` holds the switch-out time."""
        table = self._bpf[b"switched_out"]
        found = []
        for key in list(table.keys()):
            try:
                v = table[key]
            except KeyError:  # switched in meanwhile
                continue
            found.append((int(key.value), RawBlock(
                int(v.tgid), int(v.user_stack_id), int(v.kernel_stack_id), int(v.reason), _comm(v.comm),
                int(v.time_ns), 0, int(v.java_state), int(v.java_frame),
            )))
        return found

    def tick(self, interval: int) -> None:
        """Interval ``interval`` of the window ends: snapshot the sums, so that collect() splits them by
        interval too (profiler/sampling/offcpu_timeline.py)."""
        if self._bpf is None or not self._attached:
            return
        if self._timeline is None:
            self._timeline = OffCpuTimeline(self.min_block_ns, self.sample_every)
        now_ns = time.monotonic_ns()
        opened = [OpenBlock(tid, block.blocked_ns, block_key(block)) for tid, block in self._switched_out()]
        self._timeline.snapshot(interval, now_ns, sums_of(scaled(self._summed(), self.sample_every)), opened)

    def stop(self) -> None:
        """Detach; the threads still switched out count up to now (their block began in the window)."""
        if self._bpf is None or not self._attached:
            return
        if self._java is not None:
            self._java.stop()
        try:
            self._bpf.detach_raw_tracepoint(tp=b"sched_switch")
        except Exception:  # noqa: BLE001 - already gone: nothing to detach
            pass
        self._attached = False
        end_ns = time.monotonic_ns()  # bpf_ktime_get_ns is CLOCK_MONOTONIC
        pending = [block for _tid, block in self._switched_out()]
        self._pending = open_blocks(pending, end_ns, self.min_block_ns)

    def _summed(self) -> list[RawBlock]:
        """The kernel's sums so far (not scaled)."""
        return [
            RawBlock(int(key.tgid), int(key.user_stack_id), int(key.kernel_stack_id), int(key.reason),
                     _comm(key.comm), int(value.blocked_ns), int(value.switches), int(key.java_state),
                     int(key.java_frame))
            for key, value in self._bpf[b"blocked"].items()
        ]

    def read_blocks(self) -> dict[int, list[RawBlock]]:
        """The kernel's sums and the blocks closed at stop(), per PID."""
        by_pid: dict[int, list[RawBlock]] = {}
        if self._bpf is None:
            return by_pid
        for block in self._summed():
            by_pid.setdefault(block.tgid, []).append(block)
        for block in self._pending:
            by_pid.setdefault(block.tgid, []).append(block)
        return {pid: scaled(blocks, self.sample_every) for pid, blocks in by_pid.items()}

    def collect(self, symbols_for: Callable[[int], Any] = default_symbols) -> dict[int, list[OffCpuEntry]]:
        """Entries per added PID (empty when it never blocked long enough); names the stacks now."""
        if self._attached:
            self.stop()
        by_pid = self.read_blocks()
        result: dict[int, list[OffCpuEntry]] = {pid: [] for pid in sorted(self._pids)}
        if self._bpf is None:
            return result
        stacks = self._bpf[b"offcpu_stacks"]
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

        per_interval: dict[int, list[RawBlock]] = {}
        if self._timeline is not None:
            final = [block for blocks in by_pid.values() for block in blocks]
            per_interval = self._timeline.finish(self._timeline.last_interval, final)
        kernel = KernelSymbols()
        try:
            for pid, blocks in sorted(by_pid.items()):
                symbols = symbols_for(pid)
                try:
                    java_name = self._java.namer_for(pid) if self._java is not None else (lambda _frame: None)
                    names = (stack_of, _frame_namer(symbols), kernel.resolve, java_name)
                    result[pid] = name_blocks(blocks, *names)
                    for interval, interval_blocks in per_interval.items():
                        mine = [block for block in interval_blocks if block.tgid == pid]
                        if mine:
                            self.interval_entries.setdefault(interval, {})[pid] = name_blocks(mine, *names)
                finally:
                    symbols.close()
        finally:
            kernel.close()
        self._check_drops(sum(e.blocked_ns for entries in result.values() for e in entries))
        return result

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
        from .sampler import bpf_prog_ids

        return bpf_prog_ids(self._bpf) if self._bpf is not None else []

    def close(self) -> None:
        """Detach and unload; safe to call more than once."""
        if self._java is not None:
            self._java.close()
            self._java = None
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            self._attached = False
            bpf.cleanup()

    def __enter__(self) -> OffCpuTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
