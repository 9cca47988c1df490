"""The eBPF stack sampler: one bcc program for all target processes, folded stacks per PID after the window.

Requires root (CAP_BPF + CAP_PERFMON), bcc and kernel headers; works without a hardware PMU (software
cpu-clock event). Native frames are named in batches during the window (name_batch, every interval), the
rest of symbolization in collect(), after stop().

Two ways to collect (``collection``; "auto" picks the first that loads, recorded in meta.json):
- "ringbuf" (Linux 5.8+, the default): every sample's raw stacks and timestamp go through a BPF ring
  buffer that a reader thread drains every READ_PERIOD seconds (no wake-up per sample); user space
  deduplicates them (profiler/capture/stackstore.py), counts them per timeline interval, and names Java frames
  with the perf-map version of the sample's time (profiler/symbols/perfmap_history.py). Nothing has a fixed
  number of distinct stacks, so long windows lose nothing; the only losses are the ring buffer full
  (``dropped``) and stacks the kernel could not walk.
- "stackmap" (the fallback): samples aggregated in the kernel by stack id, as bcc's profile.py does; a
  full map or a hash collision loses the stack (counted), and there is no time axis.

Counting: ``samples`` (in-kernel, per process) = stacks in the folded output + ``dropped``. A stack
that could not be obtained is counted in ``lost_user_stack``/``lost_kernel_stack`` and folded as
``[lost user stack]``/``[lost kernel stack]``, so shares are not biased; a user-mode sample has no kernel
stack and is not lost. A stack with exactly
``max_stack_depth`` frames counts as ``truncated``. Depths above kernel.perf_event_max_stack raise that
sysctl for the sampler's lifetime (restored by close()); ``max_stack_depth`` tells what was used.
Perf maps (``perf_map_mode``): "auto" = none for a JVM whose JIT frames the HotSpot unwinder names from its
code cache (nothing attached to it), else Compiler.perfmap on JDK 17+, the JVMTI agent on older JDKs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..capture.checkpoint import start_ticks
from ..capture.format import DEFAULT_INTERVAL
from ..capture.stackstore import CollectedStacks, SamplerCheckpoint, StackStore
from ..defaults import DEFAULT_FREQUENCY, DEFAULT_PERF_MAP_REFRESH, DEFAULT_STACK_STORAGE_SIZE
from ..errors import CapabilityError, ConfigError, PrivilegeError
from ..scope.threadnames import ThreadLabel
from ..scope.threadwatch import ThreadWatch
from ..symbols.batches import BATCH_CHUNKS, WindowSymbols
from ..symbols.symbolprep import PERF_MAP_MODES, SymbolPreparer
from ..unwind.hotspot import MethodNamer
from .collect import collect_ringbuf, collect_stackmap, end_of_run_warnings, target_counts
from .preparation import WalkerTargets
from .program import SamplerProgram, bpf_prog_ids
from .reader import RingReader


@dataclass(frozen=True)
class _Target:
    pid: int
    start_ticks: int | None  # /proc/PID/stat starttime: tells a reused pid from the original


class StackSampler:
    """Samples user and kernel stacks of a changing set of processes at a fixed frequency on every CPU.

    Coordinates: the BPF program's sizes, text and loading are a SamplerProgram's (program.py), the ring
    buffer's reading a RingReader's (reader.py), each target's unwind tables, vmStructs and CPython frames
    the WalkerTargets' (preparation.py), perf maps and symbol caches a SymbolPreparer's
    (profiler/symbols/symbolprep.py); collect() folds the stacks with collect.py's functions.
    """

    def __init__(
        self,
        frequency: int = DEFAULT_FREQUENCY,
        max_stack_depth: int | None = None,
        stack_storage_size: int = DEFAULT_STACK_STORAGE_SIZE,
        perf_map_mode: str = "auto",
        count_map_size: int | None = None,
        collection: str = "auto",
        interval: float = DEFAULT_INTERVAL,
        perf_map_refresh: float = DEFAULT_PERF_MAP_REFRESH,
        stack_walk: str = "auto",
        thread_names: bool = True,
        checkpoints: bool = False,
        perf_map_dir: Path | None = None,
        hotspot_unwind: bool = True,
        exact_inlining: bool = False,
    ) -> None:
        if perf_map_mode not in PERF_MAP_MODES:
            raise ConfigError(f"perf map mode {perf_map_mode!r}: use one of {', '.join(PERF_MAP_MODES)}")
        if interval <= 0:
            raise ConfigError(f"interval {interval}: must be positive seconds; use e.g. --interval 10")
        if perf_map_refresh < 0:
            raise ConfigError(f"perf map refresh {perf_map_refresh}: must be >= 0 seconds (0 = at the end only)")
        self.warnings: list[str] = []
        self.program = SamplerProgram(
            self.warnings, frequency, max_stack_depth, stack_storage_size, count_map_size, collection, stack_walk
        )
        self.interval = interval
        self._bpf: Any = None
        self._attached = False
        # one user of the BPF object's maps at a time: the reader consumes the ring buffer, the preparation
        # workers publish JVMs, the runner's thread adds and removes targets (bcc's objects are not thread-safe)
        self._maps_lock = threading.Lock()
        # each target's unwind tables, vmStructs and CPython frames, in workers beside sampling (preparation.py)
        self.walker = WalkerTargets(
            lambda: self.stack_walk == "bpf",
            lambda: self._bpf if self._attached else None,
            self._maps_lock,
            self.warnings,
            hotspot_unwind,
            exact_inlining,
        )
        self.walker.jvms.keep_log = checkpoints  # the Java names learned since the last checkpoint
        self._symbols = SymbolPreparer(
            perf_map_mode,
            perf_map_refresh,
            self._alive,
            self.warnings,
            on_jvm=self.walker.attach_jvm,
            scratch=perf_map_dir,
            jit_walkable=self.walker.jit_walkable,
        )
        self._store = StackStore(int(interval * 1e9))
        self._window: WindowSymbols | None = None  # native names found during the window (name_batch)
        self._store.track_deltas = checkpoints  # checkpoint() hands out what changed since its last call
        self._store.track_fresh = True  # name_batch() takes the chunks stored since its last call
        self._store.pack_user_stacks()  # the window's largest part, held as value ids until end_window()
        self._file_lock = threading.Lock()  # the reader thread files samples; checkpoint() takes the delta
        # Full thread names need each sample's tid and time: the ring buffer's, not the stack map's.
        self._names: ThreadWatch | None = ThreadWatch(self.warnings) if thread_names else None
        self._reader: RingReader | None = None  # the ring buffer's (reader.py), from start()
        self._stopped_ns: int | None = None
        self._targets: dict[int, _Target] = {}
        self._exited: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ the program as loaded (program.py)

    @property
    def stack_walk(self) -> str:  # "bpf" (our walker) or "kernel" (bpf_get_stack): what start() loaded
        return self.program.stack_walk

    @property
    def collection(self) -> str:  # "ringbuf" or "stackmap": what start() loaded
        return self.program.collection

    @property
    def max_stack_depth(self) -> int:  # the depth the kernel allowed (known after start())
        return self.program.max_stack_depth

    def bpf_text(self, collection: str | None = None) -> str:  # the generated C, as compiled (--print-bpf)
        return self.program.bpf_text(collection)

    def share_walker(self, offcpu_text: str) -> None:
        """Compile the off-CPU tracer's program (``offcpu_text``, offcpu_trace.c with its defines) into the
        walker's, so a blocked thread's stack is walked by the walker's code and tables; before start()."""
        self.program.offcpu_text = offcpu_text

    def offcpu_program(self) -> Any:
        """The BPF object holding the off-CPU program with the walker (after start()), or None: not asked,
        no walker, or refused (a warning says why); the off-CPU tracer then loads its own."""
        return self._bpf if self.program.offcpu_walker else None

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Compile and attach on every CPU. Nothing is sampled until add_pid()."""
        if self._bpf is not None or self._closed:
            raise RuntimeError("StackSampler.start() called twice or after close()")
        if os.geteuid() != 0:
            raise PrivilegeError("the stack sampler needs root (CAP_BPF and CAP_PERFMON); run with sudo")
        try:
            from bcc import BPF, PerfSWConfig, PerfType
        except ImportError as exc:
            raise CapabilityError(f"bcc is not importable ({exc}); install python3-bpfcc (scripts/setup.sh)") from None
        try:
            self._bpf = self.program.load(BPF)
            self.walker.start_tables(self._bpf)
            self._bpf.attach_perf_event(
                ev_type=PerfType.SOFTWARE,
                ev_config=PerfSWConfig.CPU_CLOCK,
                fn_name=b"on_cpu_clock",
                sample_freq=self.program.frequency,
            )
            self._attached = True
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception; it becomes a CapabilityError
            self.close()
            raise CapabilityError(
                f"{self.program.source_name()}: loading the BPF stack sampler failed ({str(exc).strip()[:300]}); "
                "check `profiler doctor` (kernel headers, CAP_BPF, perf_event_paranoid)"
            ) from None
        if self.collection == "ringbuf":
            self._reader = RingReader(
                self._bpf,
                self._store,
                self.walker.jvms,
                self._symbols,
                self._names,
                walker=self.stack_walk == "bpf",
                max_stack_depth=self.max_stack_depth,
                file_lock=self._file_lock,
                maps_lock=self._maps_lock,
                pythons=self.walker.pythons if self.stack_walk == "bpf" else None,
            )
            if self._names is not None:
                self._names.start()
            self._reader.start()
        else:
            self._names = None
        self._symbols.start(keep_history=self.collection == "ringbuf")
        self.walker.start()

    # ------------------------------------------------------------ the window

    def begin_window(self) -> None:
        """The window starts now: timeline intervals count from here."""
        self._store.begin(time.monotonic_ns())

    def _last_interval(self) -> int | None:
        """The timeline's last interval: a sample on the window's very end belongs to it."""
        if self._store.origin_ns is None or self._stopped_ns is None:
            return None
        elapsed = max(1, self._stopped_ns - self._store.origin_ns)
        return max(0, -(-elapsed // self._store.interval_ns) - 1)

    def jvm_namer(self, pid: int) -> MethodNamer | None:
        """The namer of ``pid``'s JVM the sampler opened (its vmStructs read), None when it has none (yet).
        Lent: it stays the sampler's, closed by close()."""
        return self.walker.jvms.namers.get(pid)

    def thread_label(self, tgid: int, tid: int, time_ns: int, comm: bytes) -> ThreadLabel | None:
        """How the samples name thread ``tid`` at ``time_ns`` (its kind and context, from its full name);
        None without thread names. The off-CPU tracer names its blocks with it: one namer for both."""
        return self._names.label(tgid, tid, time_ns, comm) if self._names is not None else None

    @property
    def first_sample(self) -> tuple[int, float] | None:
        """The first sample's kernel time (CLOCK_MONOTONIC ns) and the agent's CPU seconds when the reader filed
        it (at most READ_PERIOD later); None before any sample or without the ring buffer."""
        return self._reader.first_sample if self._reader is not None else None

    @property
    def distinct_stacks(self) -> int:
        return self._store.distinct_stacks

    def checkpoint(self) -> SamplerCheckpoint | None:
        """What changed since the last call, for the checkpoint journal; None without the ring buffer (the
        stack map keeps samples in the kernel) or when checkpoints were not asked for. Called by the
        runner's thread: the reader thread only waits for the lock while the delta is swapped out."""
        if self._bpf is None or self.collection != "ringbuf" or not self._store.track_deltas:
            return None
        with self._file_lock:
            delta = self._store.take_delta()
        with self._maps_lock:
            dropped = {pid: target_counts(self._bpf, pid)[1] for pid in list(self._targets)}
        versions, names = self._symbols.history_versions(), self.walker.jvms.take_names()
        return SamplerCheckpoint(delta, self._store.origin_ns, dropped, versions, names)

    def name_batch(self, limit: int = BATCH_CHUNKS) -> int:
        """During the window (the runner's thread, every interval): the native frames of up to ``limit`` stack
        chunks stored since the last batch named now, while their processes run (see
        profiler/symbols/batches.py); returns how many stacks were new since the last batch."""
        if self._bpf is None or self.collection != "ringbuf":
            return 0
        if self._window is None:
            self._window = WindowSymbols(self._symbols.window_symbols, self.stack_walk == "bpf")
        with self._file_lock:
            fresh = self._store.take_fresh(limit)
        return self._window.name_batch(fresh)

    @property
    def thread_names(self) -> str:
        """Where the stacks' thread names come from: "uprobe" (renames watched), "jcmd" (read once), "comm"."""
        if self._names is None:
            return "comm"
        if self._names.mode == "uprobe":
            return "uprobe"
        return "jcmd" if self._names.seeded else "comm"

    def add_pid(self, pid: int) -> None:
        """Start sampling ``pid`` (all its threads, also those created later) now; its unwind tables and
        vmStructs are prepared beside it, in a worker with a deadline (preparation.py). Safe while sampling."""
        if self._bpf is None:
            raise RuntimeError("StackSampler.add_pid() before start()")
        with self._lock:
            if pid in self._targets:
                return
            self._targets[pid] = _Target(pid, start_ticks(pid))
        if self._names is not None:
            self._names.add_pid(pid)
        with self._maps_lock:
            targets = self._bpf[b"targets"]
            key = targets.Key(pid)
            try:
                targets[key]
            except KeyError:
                targets[key] = targets.Leaf()  # zeroed counters
        self.walker.submit(pid)

    def sample_count(self, pid: int) -> int:
        """Samples of ``pid`` so far (one map lookup, no symbolization): lets callers watch progress."""
        if self._bpf is None:
            return 0
        with self._maps_lock:
            targets = self._bpf[b"targets"]
            try:
                return int(targets[targets.Key(pid)].samples)
            except KeyError:
                return 0

    @property
    def pids(self) -> list[int]:
        return sorted(self._targets)

    def prepare_symbols(self, pid: int) -> None:
        """Queue the perf-map dump and symbol-cache warm-up of a process that entered the scope.

        Runs in a background thread (a JVM found at exec needs a moment before it can be attached).
        """
        self._symbols.prepare(pid)

    def prepare_unwinding(self, pids: Sequence[int], wait: float = 0.0) -> bool:
        """Prepare the unwind tables and JVM vmStructs of ``pids`` in the preparation workers (add_pid()
        does it for every target) and wait up to ``wait`` seconds for them: until a process's tables are in,
        its samples are walked by frame pointers only and stop in glibc; until a JVM's code cache is
        published the walker cannot step its JIT frames. True when all were done (or given up) in time."""
        return self.walker.wait(pids, wait)

    def pid_exited(self, pid: int) -> None:
        """The process is gone: its samples stay; it symbolizes with the cache prepare_symbols() built."""
        with self._lock:
            self._exited.add(pid)
        self.walker.forget(pid, self._bpf)

    def stop(self) -> None:
        """Detach the perf events (the window ends); the maps stay readable for collect()."""
        self.walker.stop_preparation()
        if self._bpf is not None and self._attached:
            from bcc import PerfSWConfig, PerfType

            with self._maps_lock:  # no JVM published once the window is over
                self._bpf.detach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK)
                self._attached = False
            self._stopped_ns = time.monotonic_ns()
        if self._names is not None:
            self._names.stop()  # the last seeds reach the history before the reader's last drain
        if self._reader is not None:
            self._reader.stop()
        self._store.end_window()  # the batches are over, the stacks held as addresses again for the post-run
        self._symbols.stop()
        self.walker.stop_tables()

    def close(self) -> None:
        """Free the BPF program and maps and restore the sysctl. Idempotent, safe after any failure."""
        self.walker.stop_preparation()
        if self._reader is not None:
            self._reader.halt()
        self._symbols.stop()
        self.walker.stop_tables()
        try:
            if self._names is not None:
                self._names.close()
        finally:
            if self._bpf is not None:
                with self._maps_lock:  # a late preparation worker finds no BPF object, never a freed one
                    try:
                        self.program.drop_tail_calls(self._bpf)
                        self._bpf.cleanup()
                    finally:
                        self._bpf = None
                        self._attached = False
        self._symbols.close()
        if self._window is not None:
            self._window.close()
            self._window = None
        self.walker.close()
        self.program.depth_limit.restore(self.warnings)
        self._closed = True

    def __enter__(self) -> StackSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def prog_ids(self) -> list[int]:
        """Kernel ids of the loaded BPF programs (for bpf_stats run_time_ns)."""
        names = bpf_prog_ids(self._names.bpf) if self._names is not None else []
        return sorted(bpf_prog_ids(self._bpf) + names)

    def _alive(self, pid: int) -> bool:
        """The sampled process (not a later one with its pid) still runs."""
        target = self._targets.get(pid)
        if pid in self._exited:
            return False
        ticks = start_ticks(pid)
        return ticks is not None and (target is None or target.start_ticks in (None, ticks))

    # ------------------------------------------------------------ collection

    def collect(self) -> dict[int, CollectedStacks]:
        """Folded stacks (and their timeline) and stats per target PID. Call after stop(); symbolizes now."""
        if self._bpf is None:
            raise RuntimeError("StackSampler.collect() needs a started sampler (and before close())")
        if self._attached:
            self.stop()
        if self._reader is not None:
            self._reader.stop()
        self._store.end_window()
        self._symbols.stop()
        if self.collection == "ringbuf":
            named = self._reader.kernel_named if self._names is not None and self._reader is not None else None
            jvms = self.walker.jvms if self.stack_walk == "bpf" else None
            collected, dropped = collect_ringbuf(
                self._bpf, self._store, self._symbols, jvms, self._targets, self.max_stack_depth,
                self.program.kernel_stack_depth, self._last_interval(), self.walker.cfi, self._window, named,
                self.walker.pythons.namers,
            )  # fmt: skip
            stats = {pid: c.stats for pid, c in collected.items()}
            self.warnings.extend(end_of_run_warnings(stats, Counter(), dropped, self.program, self.walker.jvms.errors))
            return collected
        result, lost, dropped = collect_stackmap(self._bpf, self._symbols, self._targets, self.max_stack_depth)
        by_pid = {pid: stats for pid, (_folded, stats) in result.items()}
        self.warnings.extend(end_of_run_warnings(by_pid, lost, dropped, self.program, self.walker.jvms.errors))
        return {pid: CollectedStacks.of_folded(folded, None, stats) for pid, (folded, stats) in result.items()}
