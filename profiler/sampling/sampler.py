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

import ctypes as ct
import errno
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ..bpf.compiler import compile_program, release_freed_memory
from ..capture.checkpoint import start_ticks
from ..capture.format import DEFAULT_INTERVAL, SamplerStats
from ..capture.stackstore import (
    CUT_CFI_MISS,
    CUT_NATIVE,
    CUT_NO_CFI,
    INTERPRETED_TAG,
    NO_UNLOADS,
    TAG_MASK,
    CollectedStacks,
    SamplerCheckpoint,
    SampleRecord,
    StackStore,
    join_epoch,
    parse_record,
    parse_walk_record,
)
from ..capture.stacktable import StackTableBuilder
from ..defaults import DEFAULT_FREQUENCY, DEFAULT_PERF_MAP_REFRESH
from ..errors import CapabilityError, ConfigError, PrivilegeError
from ..scope.threadnames import ThreadLabel
from ..scope.threadwatch import ThreadWatch
from ..symbols.batches import BATCH_CHUNKS, WindowSymbols
from ..symbols.procsyms import ProcessSymbols
from ..symbols.symbolize import (
    Frame,
    KernelSymbols,
    StackFolder,
    fold_stack,
    is_java_unwalkable,
    tabulate_store,
)
from ..symbols.symbolprep import PERF_MAP_MODES, SymbolPreparer
from ..unwind.cfi import CfiLoader
from ..unwind.codecache import COMPILED_TAG, CodeCacheLayout
from ..unwind.hotspot import JvmNames, MethodNamer, VMLayout

STACK_NONE = -1  # kernel stack not asked for (user-mode sample); see stack_sampler.c
MAX_TARGETS = 4096
PERF_EVENT_MAX_STACK = "/proc/sys/kernel/perf_event_max_stack"
COLLECTIONS = ("auto", "ringbuf", "stackmap")
STACK_WALKS = ("auto", "bpf", "kernel")  # bpf: our walker (stack_walk.c); kernel: bpf_get_stack
DEFAULT_DEPTH = {"bpf": 1024, "kernel": 127}  # frames kept per user stack when --max-stack-depth is not given
CHUNK_FRAMES = 32  # frames per program of the walker's tail-call chain (the HotSpot step: dear to verify)
WALK_LIMIT = CHUNK_FRAMES * 34  # the first program and 33 tail calls (the kernel's MAX_TAIL_CALL_CNT)
READ_PERIOD = 0.2  # seconds between ring-buffer drains
KERNEL_STACK_DEPTH_MAX = 127  # kernel stacks are short; the user depth is the one users raise
RINGBUF_SECONDS = 2.0  # the buffer holds this long of samples at full rate: ten drain periods
RINGBUF_MIN_PAGES, RINGBUF_MAX_PAGES = 256, 65536  # 1 MiB .. 256 MiB with 4 KiB pages


@dataclass(frozen=True)
class _Target:
    pid: int
    start_ticks: int | None  # /proc/PID/stat starttime: tells a reused pid from the original


def _read_int(path: str) -> int:
    with open(path, encoding="ascii") as handle:
        return int(handle.read().strip())


def _write_int(path: str, value: int, attempts: int = 30) -> None:
    """Write a sysctl; EBUSY (another perf/BPF stack user holds callchain buffers) is retried briefly."""
    for attempt in range(attempts):
        try:
            with open(path, "w", encoding="ascii") as handle:
                handle.write(str(value))
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == attempts - 1:
                raise
            time.sleep(0.1)


class StackDepthLimit:
    """kernel.perf_event_max_stack bounds both stack map creation and each walk: a deeper walk than
    the sysctl allows raises it for the sampler's lifetime; ``restore()`` puts back what was there."""

    def __init__(self, requested: int) -> None:
        self.requested = requested
        self._restore: tuple[int, int] | None = None  # (original, value we set)

    def apply(self, warnings: list[str]) -> int:
        """Raise the sysctl if asked; the depth the kernel will walk (a warning says why when less)."""
        try:
            current = _read_int(PERF_EVENT_MAX_STACK)
        except (OSError, ValueError):
            return self.requested
        wanted = self.requested
        if wanted <= current:
            return wanted
        try:
            _write_int(PERF_EVENT_MAX_STACK, wanted)
            self._restore = (current, wanted)
        except OSError as exc:
            warnings.append(
                f"stack depth {wanted} not possible: raising kernel.perf_event_max_stack from {current} failed "
                f"({os.strerror(exc.errno or 0)}; another perf or BPF stack user holds it); sampled "
                f"{current} frames deep; stop other profilers or lower --max-stack-depth"
            )
            return current
        return wanted

    def restore(self, warnings: list[str]) -> None:
        """Put the sysctl back unless someone else changed it since. Idempotent."""
        if self._restore is None:
            return
        original, ours = self._restore
        self._restore = None
        try:
            if _read_int(PERF_EVENT_MAX_STACK) == ours:
                _write_int(PERF_EVENT_MAX_STACK, original)
        except (OSError, ValueError) as exc:
            warnings.append(
                f"could not restore kernel.perf_event_max_stack to {original} ({exc}); "
                f"run: sysctl kernel.perf_event_max_stack={original}"
            )


class StackSampler:
    """Samples user and kernel stacks of a changing set of processes at a fixed frequency on every CPU.

    Owns the BPF program (life cycle, targets, the ring-buffer reader thread); the depth sysctl is a
    StackDepthLimit's, perf maps and symbol caches a SymbolPreparer's (profiler/symbols/symbolprep.py), and
    collect() folds the stacks with collect_ringbuf or collect_stackmap below.
    """

    def __init__(
        self,
        frequency: int = DEFAULT_FREQUENCY,
        max_stack_depth: int | None = None,
        stack_storage_size: int = 16384,
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
    ) -> None:
        if stack_walk not in STACK_WALKS:
            raise ConfigError(f"stack walk {stack_walk!r}: use one of {', '.join(STACK_WALKS)}")
        if collection == "stackmap" and stack_walk == "bpf":
            raise ConfigError("--stack-walk bpf needs the ring buffer: drop --stack-collection stackmap")
        self.requested_walk = "kernel" if collection == "stackmap" else stack_walk
        self.stack_walk = "kernel" if self.requested_walk == "kernel" else "bpf"  # what start() loaded
        self.requested_depth = max_stack_depth
        if max_stack_depth is None:
            max_stack_depth = DEFAULT_DEPTH[self.stack_walk]
        if frequency <= 0:
            raise ConfigError(f"frequency {frequency}: must be a positive number of Hz; use e.g. --frequency 99")
        if not 1 <= max_stack_depth <= 65535:
            raise ConfigError(f"max stack depth {max_stack_depth}: must be 1..65535; use e.g. 127 or 512")
        if stack_storage_size <= 0:
            raise ConfigError(f"stack storage size {stack_storage_size}: must be positive; use e.g. 16384")
        if perf_map_mode not in PERF_MAP_MODES:
            raise ConfigError(f"perf map mode {perf_map_mode!r}: use one of {', '.join(PERF_MAP_MODES)}")
        if collection not in COLLECTIONS:
            raise ConfigError(f"stack collection {collection!r}: use one of {', '.join(COLLECTIONS)}")
        if interval <= 0:
            raise ConfigError(f"interval {interval}: must be positive seconds; use e.g. --interval 10")
        if perf_map_refresh < 0:
            raise ConfigError(f"perf map refresh {perf_map_refresh}: must be >= 0 seconds (0 = at the end only)")
        self.frequency = frequency
        self._depth = StackDepthLimit(max_stack_depth)
        self.max_stack_depth = max_stack_depth  # what the kernel allowed; set by start()
        self.stack_storage_size = stack_storage_size
        self.count_map_size = count_map_size or max(4 * stack_storage_size, 16384)
        self.requested_collection = collection
        self.collection = "stackmap" if collection == "stackmap" else "ringbuf"  # what start() loaded
        self.interval = interval
        self.hotspot_unwind = hotspot_unwind  # JIT frames stepped by their CodeBlob (else frame pointers only)
        self.warnings: list[str] = []
        self._jvms = JvmNames(self._publish_jvm)
        self._symbols = SymbolPreparer(
            perf_map_mode,
            perf_map_refresh,
            self._alive,
            self.warnings,
            on_jvm=self._attach_jvm,
            scratch=perf_map_dir,
            jit_walkable=self.jit_walkable,
        )
        self._store = StackStore(int(interval * 1e9))
        self._window: WindowSymbols | None = None  # native names found during the window (name_batch)
        self._store.track_deltas = checkpoints  # checkpoint() hands out what changed since its last call
        self._store.track_fresh = True  # name_batch() takes the chunks stored since its last call
        self._store.pack_user_stacks()  # the window's largest part, held as value ids until end_window()
        self._jvms.keep_log = checkpoints  # and the Java names learned since
        self._file_lock = threading.Lock()  # the reader thread files samples; checkpoint() takes the delta
        # Full thread names need each sample's tid and time: the ring buffer's, not the stack map's.
        self._names: ThreadWatch | None = ThreadWatch(self.warnings) if thread_names else None
        self._pending: list[SampleRecord] = []
        self._kernel_named: Counter[int] = Counter()  # samples per tgid named by the comm only
        self._ring_callback: Any = None
        self._reader: threading.Thread | None = None
        self._reader_stop = threading.Event()
        self._stopped_ns: int | None = None
        self.reader_errors = 0
        self._bpf: Any = None
        self._cfi: CfiLoader | None = None  # unwind tables for the walker (profiler/unwind/cfi.py)
        self._attached = False
        self._targets: dict[int, _Target] = {}
        self._exited: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ program text

    @property
    def kernel_stack_depth(self) -> int:
        return min(self.max_stack_depth, KERNEL_STACK_DEPTH_MAX)

    @property
    def record_size(self) -> int:
        """Bytes of the largest ring-buffer record (struct sample_t; the walker's records are as long as used)."""
        header = 48 if self.stack_walk == "bpf" else 40
        return header + 8 * (self.max_stack_depth + self.kernel_stack_depth)

    @property
    def walk_slots(self) -> tuple[int, int]:
        """(leaf, root) frames the walker keeps of a stack deeper than max_stack_depth: a quarter for the
        root end (a power of two: the ring's index is masked), the rest for the leaf end."""
        root = 1
        while root * 2 <= max(1, self.max_stack_depth // 4):
            root *= 2
        return self.max_stack_depth - root, root

    def ringbuf_pages(self, cpus: int | None = None) -> int:
        """A power of two of pages holding RINGBUF_SECONDS of samples from every CPU."""
        cpus = cpus or os.cpu_count() or 1
        wanted = self.frequency * cpus * self.record_size * RINGBUF_SECONDS / 4096
        pages = RINGBUF_MIN_PAGES
        while pages < wanted and pages < RINGBUF_MAX_PAGES:
            pages *= 2
        return pages

    def bpf_text(self, collection: str | None = None) -> str:
        """The generated BPF C, as compiled (``--print-bpf``)."""
        collection = collection or self.collection
        if collection == "walker":
            name = "stack_walk.c"
            leaf, root = self.walk_slots
            values = {
                "LEAF_SLOTS": leaf,
                "ROOT_SLOTS": root,
                "WALK_LIMIT": max(WALK_LIMIT, self.max_stack_depth),
                "CHUNK_FRAMES": CHUNK_FRAMES,
                "KERNEL_STACK_DEPTH": self.kernel_stack_depth,
                "MAX_TARGETS": MAX_TARGETS,
                "RINGBUF_PAGES": self.ringbuf_pages(),
            }
        elif collection == "ringbuf":
            name = "stack_ringbuf.c"
            values = {
                "MAX_STACK_DEPTH": self.max_stack_depth,
                "KERNEL_STACK_DEPTH": self.kernel_stack_depth,
                "MAX_TARGETS": MAX_TARGETS,
                "RINGBUF_PAGES": self.ringbuf_pages(),
            }
        else:
            name = "stack_sampler.c"
            values = {
                "MAX_STACK_DEPTH": self.max_stack_depth,
                "STACK_STORAGE_SIZE": self.stack_storage_size,
                "COUNTS_SIZE": self.count_map_size,
                "MAX_TARGETS": MAX_TARGETS,
            }
        package = resources.files("profiler.sampling")
        source = package.joinpath(name).read_text(encoding="utf-8")
        # Inlined, so that --print-bpf shows the whole program and bcc needs no include path.
        source = source.replace('#include "targets.h"\n', package.joinpath("targets.h").read_text(encoding="utf-8"))
        source = source.replace('#include "cfi_step.h"\n', CfiLoader.bpf_header())
        hotspot_header = resources.files("profiler.unwind").joinpath("hotspot_step.h").read_text(encoding="utf-8")
        source = source.replace('#include "hotspot_step.h"\n', hotspot_header)
        header = "".join(f"#define {key} {value}\n" for key, value in values.items())
        return header + source

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
            self._bpf = self._load(BPF)
            self._bpf.attach_perf_event(
                ev_type=PerfType.SOFTWARE,
                ev_config=PerfSWConfig.CPU_CLOCK,
                fn_name=b"on_cpu_clock",
                sample_freq=self.frequency,
            )
            self._attached = True
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception; it becomes a CapabilityError
            self.close()
            raise CapabilityError(
                f"{self._source_name()}: loading the BPF stack sampler failed ({str(exc).strip()[:300]}); "
                "check `profiler doctor` (kernel headers, CAP_BPF, perf_event_paranoid)"
            ) from None
        if self.collection == "ringbuf":
            self._ring_callback = self._on_sample  # keep a reference: bcc holds only a C pointer
            self._bpf[b"samples"].open_ring_buffer(self._ring_callback)
            if self._names is not None:
                self._names.start()
            self._reader = threading.Thread(target=self._read_loop, name="ringbuf-reader", daemon=True)
            self._reader.start()
        else:
            self._names = None
        self._symbols.start(keep_history=self.collection == "ringbuf")

    def _load(self, bpf_class: Any) -> Any:
        """Compile the walker, else the ring-buffer program, else the stack-map one (as asked and as loadable)."""
        if self.requested_walk != "kernel":
            try:
                return self._load_walker(bpf_class)
            except Exception as exc:
                if self.requested_walk == "bpf":
                    raise
                self.warnings.append(
                    f"own stack walker unavailable ({str(exc).strip()[:120]}); stacks walked by bpf_get_stack "
                    "instead (interpreted Java frames unnamed, deep stacks cut at the leaf end)"
                )
                self.stack_walk = "kernel"
                if self.requested_depth is None:
                    self.max_stack_depth = DEFAULT_DEPTH["kernel"]
                    self._depth = StackDepthLimit(self.max_stack_depth)  # not the walker's deeper default
        self.max_stack_depth = self._depth.apply(self.warnings)
        if self.requested_collection != "stackmap":
            try:
                self.collection = "ringbuf"
                return compile_program(bpf_class, self.bpf_text("ringbuf"))
            except Exception as exc:
                if self.requested_collection == "ringbuf":
                    raise
                self.warnings.append(
                    f"BPF ring buffer unavailable ({str(exc).strip()[:120]}); stacks collected in the in-kernel "
                    "stack map instead (no timeline; long windows may lose stacks; Linux 5.8+ has ring buffers)"
                )
        self.collection = "stackmap"
        return compile_program(bpf_class, self.bpf_text("stackmap"))

    def _load_walker(self, bpf_class: Any) -> Any:
        """The walker and its tail-call chain (walk_more in walk_progs[0])."""
        self.collection = "ringbuf"
        self.stack_walk = "bpf"
        bpf = compile_program(bpf_class, self.bpf_text("walker"))
        try:
            more = bpf.load_func(b"walk_more", bpf_class.PERF_EVENT)
            bpf[b"walk_progs"][ct.c_int(0)] = ct.c_int(more.fd)
            bpf.load_func(b"on_cpu_clock", bpf_class.PERF_EVENT)
        except Exception:
            bpf.cleanup()
            raise
        self._cfi = CfiLoader(bpf)
        self._cfi.start()
        return bpf

    def _drop_tail_calls(self) -> None:
        """Empty the walker's tail-call array now: the kernel drops the array's hold on walk_more only in
        deferred work after the map's last fd closes, so the program would outlive close() for a moment."""
        if self.stack_walk != "bpf" or self._bpf is None:
            return
        try:
            del self._bpf[b"walk_progs"][ct.c_int(0)]
        except (KeyError, OSError):
            pass

    def _source_name(self) -> str:
        if self.stack_walk == "bpf":
            return "profiler/sampling/stack_walk.c"
        name = "stack_ringbuf.c" if self.collection == "ringbuf" else "stack_sampler.c"
        return f"profiler/sampling/{name}"

    # ------------------------------------------------------------ ring buffer (reader thread)

    def begin_window(self) -> None:
        """The window starts now: timeline intervals count from here."""
        self._store.begin(time.monotonic_ns())

    def _last_interval(self) -> int | None:
        """The timeline's last interval: a sample on the window's very end belongs to it."""
        if self._store.origin_ns is None or self._stopped_ns is None:
            return None
        elapsed = max(1, self._stopped_ns - self._store.origin_ns)
        return max(0, -(-elapsed // self._store.interval_ns) - 1)

    def _on_sample(self, _ctx: Any, data: Any, size: int) -> int:
        try:
            record = ct.string_at(data, size)
            if self.stack_walk == "bpf":
                self._pending.append(parse_walk_record(record, *self.walk_slots))
            else:
                self._pending.append((*parse_record(record, self.max_stack_depth), 0, NO_UNLOADS))
        except Exception:  # noqa: BLE001 - a bad record must not stop the drain; counted
            self.reader_errors += 1
        return 0

    def _attach_jvm(self, pid: int) -> bool:
        """A JVM entered the scope (symbol worker): read its vmStructs so the walker names interpreted frames."""
        return self.stack_walk == "bpf" and self._jvms.attach(pid)

    def jvm_namer(self, pid: int) -> MethodNamer | None:
        """The namer of ``pid``'s JVM the sampler opened (its vmStructs read), None when it has none (yet).
        Lent: it stays the sampler's, closed by close()."""
        return self._jvms.namers.get(pid)

    def thread_label(self, tgid: int, tid: int, time_ns: int, comm: bytes) -> ThreadLabel | None:
        """How the samples name thread ``tid`` at ``time_ns`` (its kind and context, from its full name);
        None without thread names. The off-CPU tracer names its blocks with it: one namer for both."""
        return self._names.label(tgid, tid, time_ns, comm) if self._names is not None else None

    def jit_walkable(self, pid: int) -> bool:
        """The walker steps ``pid``'s JIT frames by their CodeBlobs (no frame pointers needed)."""
        namer = self._jvms.namers.get(pid)
        walker = self.stack_walk == "bpf" and self.hotspot_unwind
        return walker and namer is not None and namer.layout.code_cache is not None

    def _publish_jvm(self, pid: int, layout: VMLayout, unloads_address: int) -> None:
        if self._bpf is None:
            raise RuntimeError("sampler not started")
        jvms = self._bpf[b"jvms"]
        entry = jvms.Leaf()
        entry.interpreter_start, entry.interpreter_end = layout.interpreter
        entry.method_slot = layout.method_slot
        entry.sender_sp_slot = layout.sender_sp_slot
        entry.unloads_at = unloads_address
        code = layout.code_cache if self.hotspot_unwind else None
        if code is not None:
            fill_code_cache(entry, code)
        jvms[jvms.Key(pid)] = entry

    def _drain(self) -> None:
        """Samples first, then thread renames, then file the samples: a rename precedes its thread's
        later samples in time, so it is in the second drain whenever the sample is in the first.
        Samples of a process whose names jcmd is still reading wait for them (a few seconds at most)."""
        if self._bpf is None:
            return
        self._bpf.ring_buffer_consume()
        names = self._names
        awaiting: frozenset[int] = frozenset()
        if names is not None:
            awaiting = names.awaiting()
            names.drain()
        pending, self._pending = self._pending, []
        with self._file_lock:
            for record in pending:
                if record[0] in awaiting:
                    self._pending.append(record)
                    continue
                try:
                    self._file(record, names)
                except Exception:  # noqa: BLE001 - a bad record must not stop the drain; counted
                    self.reader_errors += 1
        self._jvms.poll_unloads()

    def _file(self, record: SampleRecord, names: ThreadWatch | None) -> None:
        """Count one sample under its thread's name at its time (kind in the stack, context beside it), in the
        epoch that names it (perf-map version, JVM's generation of names)."""
        tgid, tid, time_ns, comm, user, kernel, walk_end, unloads = record
        generation = 0
        if isinstance(user, bytes) and tgid in self._jvms.namers:
            generation = self._jvms.generation_of(tgid, time_ns, unloads)
            if self._jvms.first_in_generation(tgid, generation, user):
                self._jvms.note_stack(tgid, *tagged_frames(user))
        epoch = join_epoch(self._symbols.epoch_at(tgid, time_ns), generation)
        context = None
        if names is not None:
            label = names.label(tgid, tid, time_ns, comm)
            comm, context = label.kind_bytes, label.context
            if not label.full:
                self._kernel_named[tgid] += 1
        self._store.add(tgid, tid, comm, time_ns, user, kernel, epoch, walk_end, context)

    def _read_loop(self) -> None:
        while not self._reader_stop.wait(READ_PERIOD):
            self._drain()

    def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader_stop.set()
            self._reader.join(timeout=30)
            self._reader = None
            self._drain()  # whatever arrived after the last period

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
        dropped = {pid: _target_counts(self._bpf, pid)[1] for pid in list(self._targets)}
        names = self._jvms.take_names()
        return SamplerCheckpoint(delta, self._store.origin_ns, dropped, self._symbols.history_versions(), names)

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
        """Start sampling ``pid`` (all its threads, also those created later). Safe while sampling."""
        if self._bpf is None:
            raise RuntimeError("StackSampler.add_pid() before start()")
        with self._lock:
            if pid in self._targets:
                return
            self._targets[pid] = _Target(pid, start_ticks(pid))
        if self._names is not None:
            self._names.add_pid(pid)
        targets = self._bpf[b"targets"]
        key = targets.Key(pid)
        try:
            targets[key]
        except KeyError:
            targets[key] = targets.Leaf()  # zeroed counters
        if self._cfi is not None:
            self._cfi.add_pid(pid)  # its unwind tables, in the loader's thread

    def sample_count(self, pid: int) -> int:
        """Samples of ``pid`` so far (one map lookup, no symbolization): lets callers watch progress."""
        if self._bpf is None:
            return 0
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

    def prepare_unwinding(self, pids: Sequence[int]) -> None:
        """Load the unwind tables of processes about to be sampled, now (call before the window: a
        process's samples before its tables are in walk by frame pointers only and stop in glibc), and
        read the JVMs' vmStructs: until a JVM's code cache is published the walker cannot step its JIT
        frames, and without -XX:+PreserveFramePointer its stacks end at the first one (the symbol
        worker attaches them too, but on a loaded host only seconds into the window)."""
        if self._cfi is not None:
            for pid in pids:
                self._cfi.load_pid(pid)
        for pid in pids:
            self._attach_jvm(pid)  # False for a process that is no JVM (reason kept in _jvms.errors)

    def pid_exited(self, pid: int) -> None:
        """The process is gone: its samples stay; it symbolizes with the cache prepare_symbols() built."""
        with self._lock:
            self._exited.add(pid)
        if self._bpf is not None and self.stack_walk == "bpf":
            jvms = self._bpf[b"jvms"]
            try:
                del jvms[jvms.Key(pid)]  # a later process with this pid is not that JVM
            except KeyError:
                pass
        if self._cfi is not None:
            self._cfi.forget_pid(pid)

    def stop(self) -> None:
        """Detach the perf events (the window ends); the maps stay readable for collect()."""
        if self._bpf is not None and self._attached:
            from bcc import PerfSWConfig, PerfType

            self._bpf.detach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK)
            self._attached = False
            self._stopped_ns = time.monotonic_ns()
        if self._names is not None:
            self._names.stop()  # the last seeds reach the history before the reader's last drain
        self._stop_reader()
        self._store.end_window()  # the batches are over, the stacks held as addresses again for the post-run
        self._symbols.stop()
        if self._cfi is not None:
            self._cfi.stop()

    def close(self) -> None:
        """Free the BPF program and maps and restore the sysctl. Idempotent, safe after any failure."""
        self._reader_stop.set()
        if self._reader is not None:
            self._reader.join(timeout=30)
            self._reader = None
        self._symbols.stop()
        if self._cfi is not None:
            self._cfi.stop()
        try:
            if self._names is not None:
                self._names.close()
        finally:
            if self._bpf is not None:
                try:
                    self._drop_tail_calls()
                    self._bpf.cleanup()
                finally:
                    self._bpf = None
                    self._attached = False
        self._symbols.close()
        if self._window is not None:
            self._window.close()
            self._window = None
        self._jvms.close()
        self._depth.restore(self.warnings)
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
        self._stop_reader()
        self._store.end_window()
        self._symbols.stop()
        if self.collection == "ringbuf":
            collected, dropped = collect_ringbuf(
                self._bpf,
                self._store,
                self._symbols,
                self._jvms if self.stack_walk == "bpf" else None,
                self._targets,
                self.max_stack_depth,
                self.kernel_stack_depth,
                self._last_interval(),
                self._cfi,
                self._window,
            )
            if self._names is not None:
                collected = {
                    pid: replace(c, stats=replace(c.stats, thread_names_kernel=self._kernel_named[pid]))
                    for pid, c in collected.items()
                }
            self._end_of_run_warnings({pid: c.stats for pid, c in collected.items()}, Counter(), dropped)
            return collected
        result, lost, dropped = collect_stackmap(self._bpf, self._symbols, self._targets, self.max_stack_depth)
        self._end_of_run_warnings({pid: stats for pid, (_folded, stats) in result.items()}, lost, dropped)
        return {pid: CollectedStacks.of_folded(folded, None, stats) for pid, (folded, stats) in result.items()}

    def _end_of_run_warnings(self, result: dict[int, SamplerStats], lost: Counter[int], dropped: int) -> None:
        # A few bucket collisions are normal in a hash of stacks; a full map or many collisions are not.
        full = lost[errno.ENOMEM] + lost[errno.EEXIST]
        total = sum(stats.samples for stats in result.values())
        if lost[errno.ENOMEM] or full > 0.005 * total:
            self.warnings.append(
                f"{full} stacks not stored (stack map full or hash collisions); raise --stack-storage-size "
                f"(now {self.stack_storage_size})"
            )
        if dropped and self.collection == "ringbuf":
            self.warnings.append(
                f"{dropped} samples not counted (ring buffer of {self.ringbuf_pages() * 4 // 1024} MiB full: the "
                "reader fell behind); lower --frequency or give the profiler more CPU"
            )
        elif dropped:
            self.warnings.append(
                f"{dropped} samples not counted (counts map of {self.count_map_size} entries full); "
                f"raise --stack-storage-size (now {self.stack_storage_size}) or shorten --duration"
            )
        for pid, stats in sorted(result.items()):
            if stats.samples and stats.interpreted_only / stats.samples >= 0.05:
                self.warnings.append(
                    f"pid {pid}: {stats.interpreted_only / stats.samples:.0%} of samples are in interpreted Java "
                    "code only (frames show as Interpreter, not by method); profile after warm-up (the JIT "
                    "compiles hot code) or see docs/capture-format.md (interpreted_only)"
                )
            if stats.java_frames and stats.java_frames_unresolved / stats.java_frames >= 0.05:
                self.warnings.append(
                    f"pid {pid}: {stats.java_frames_unresolved / stats.java_frames:.0%} of Java frames have no name "
                    "in any perf-map version; lower --perf-map-refresh (code freed between refreshes)"
                )
            unnamed = sum(stats.interpreted_unnamed.values())
            if stats.interpreted_frames and unnamed / stats.interpreted_frames >= 0.05:
                cause = max(stats.interpreted_unnamed.items(), key=lambda item: item[1])[0]
                detail = self._jvms.errors.get(pid, "")
                self.warnings.append(
                    f"pid {pid}: {unnamed / stats.interpreted_frames:.0%} of interpreted Java frames unnamed, mostly: "
                    f"{cause}{f' ({detail[:160]})' if detail else ''}; see docs/unwinding.md"
                )
            native_cut = sum(stats.stacks_cut.get(cause, 0) for cause in (CUT_NATIVE, CUT_NO_CFI, CUT_CFI_MISS))
            if stats.samples and native_cut / stats.samples >= 0.05:
                self.warnings.append(
                    f"pid {pid}: {native_cut / stats.samples:.0%} of stacks end at a native frame before the thread's "
                    "start (code without frame pointers, e.g. glibc); the task frames above it are lost"
                )
            if stats.samples and stats.truncated / stats.samples >= 0.01:
                self.warnings.append(
                    f"pid {pid}: {stats.truncated / stats.samples:.0%} of stacks hit the depth limit of "
                    f"{stats.max_stack_depth} frames; raise --max-stack-depth"
                )


# ---------------------------------------------------------------- collection (after the window)


HOTSPOT_STEPS = ("compiled", "interpreted", "no_blob", "bad_return")  # struct hs_health's fields


def hotspot_steps(bpf: Any, pid: int) -> dict[str, int]:
    """The walker's steps through ``pid``'s code cache, by kind (empty: none, or not a JVM)."""
    health = bpf[b"hs_health_map"]
    try:
        entry = health[health.Key(pid)]
    except KeyError:
        return {}
    return {name: int(getattr(entry, name)) for name in HOTSPOT_STEPS if getattr(entry, name)}


def fill_code_cache(entry: Any, code: CodeCacheLayout) -> None:
    """The walker's view of a JVM's code cache (struct jvm_t in profiler/unwind/hotspot_step.h)."""
    entry.code_low, entry.code_high = code.low, code.high
    for index, heap in enumerate(code.heaps):
        entry.heaps[index].low, entry.heaps[index].high, entry.heaps[index].segmap = heap.low, heap.high, heap.segmap
    entry.heap_count = len(code.heaps)
    entry.segment_shift = code.segment_shift
    entry.heapblock_size = code.heapblock_size
    entry.frame_size_at = code.frame_size
    entry.frame_complete_at = code.frame_complete
    entry.frame_complete_width = code.frame_complete_width
    entry.code_at = code.code
    entry.code_is_offset = int(code.code_is_offset)
    entry.kind_at = code.kind
    entry.name_at = code.name
    entry.kind_nmethod = code.kind_nmethod
    entry.kind_vtable = code.kind_vtable
    entry.compile_id_at = code.compile_id


def bpf_prog_ids(bpf: Any) -> list[int]:
    """Kernel ids of a bcc object's loaded programs (none before it loaded)."""
    if bpf is None:
        return []
    ids = []
    for fn in bpf.funcs.values():
        try:
            with open(f"/proc/self/fdinfo/{fn.fd}", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("prog_id:"):
                        ids.append(int(line.split()[1]))
        except OSError:
            continue
    return ids


def _read_counts(bpf: Any) -> list[tuple[Any, int]]:
    counts = bpf[b"counts"]
    try:
        # one syscall per batch on kernels >= 5.6, instead of two per entry
        return [(k, int(v.value)) for k, v in counts.items_lookup_batch()]
    except Exception:  # noqa: BLE001 - no batch lookup in this kernel or bcc: one by one
        return [(k, int(v.value)) for k, v in counts.items()]


def _stack(stacks: Any, cache: dict[int, tuple[int, ...]], stack_id: int) -> tuple[int, ...]:
    frames = cache.get(stack_id)
    if frames is None:
        try:
            leaf = stacks[stacks.Key(stack_id)]
            ips = []
            for addr in leaf.ip:
                if addr == 0:
                    break
                ips.append(int(addr))
            frames = tuple(ips)
        except KeyError:
            frames = ()
        cache[stack_id] = frames
    return frames


def _target_counts(bpf: Any, pid: int) -> tuple[int, int]:
    """(samples, dropped) the BPF program counted for ``pid``."""
    targets = bpf[b"targets"]
    try:
        target = targets[targets.Key(pid)]
        return int(target.samples), int(target.dropped)
    except KeyError:
        return 0, 0


def tagged_frames(user: bytes) -> tuple[list[int], list[int]]:
    """A walker stack's interpreted frames' Method* pointers, and its compiled frames' stored values (pc
    and compile id under COMPILED_TAG)."""
    values = struct.unpack(f"<{len(user) // 8}Q", user)
    methods = [value & ~TAG_MASK for value in values if value & TAG_MASK == INTERPRETED_TAG]
    return methods, [value for value in values if value & TAG_MASK == COMPILED_TAG]


def collect_ringbuf(
    bpf: Any,
    store: StackStore,
    symbols_of: SymbolPreparer,
    jvms: JvmNames | None,
    targets: Iterable[int],
    max_stack_depth: int,
    kernel_stack_depth: int,
    last: int | None,
    cfi: CfiLoader | None = None,
    window: WindowSymbols | None = None,
) -> tuple[dict[int, CollectedStacks], int]:
    """The ring buffer's samples folded per PID with their timeline (``last``: the window's last
    interval), each Java frame named by the perf-map version of its sample's time, interpreted frames by
    ``jvms`` (our walker; None: bpf_get_stack's stacks), stacks ending at a native frame told apart by
    ``cfi``'s tables, native names found during the window taken from ``window``; and the samples dropped
    in all (ring buffer full)."""
    result: dict[int, CollectedStacks] = {}
    kernel = KernelSymbols()
    dropped_total = 0
    try:
        kernel.name_all(store.kernel_stacks())
        release_freed_memory()
        for pid in sorted(set(targets) | set(store.pids())):
            samples, dropped = _target_counts(bpf, pid)
            dropped_total += dropped
            stats = SamplerStats(pid=pid, samples=samples, max_stack_depth=max_stack_depth, dropped=dropped)
            table = StackTableBuilder().build()
            if store.epochs(pid):
                if jvms is not None:
                    jvms.final_check(pid)
                symbols, owned = symbols_of.symbols_for(pid)
                if window is not None:
                    window.adopt_into(pid, symbols)
                if owned:
                    symbols_of.release_symbols(pid)  # a fresh cache names it: the prepared one's tables go now
                try:
                    is_java = symbols_of.is_java(pid, symbols)
                    folder = StackFolder(
                        symbols,
                        kernel,
                        max_stack_depth,
                        is_java,
                        kernel_stack_depth,
                        walker=jvms is not None,
                        methods=jvms.namers.get(pid) if jvms is not None else None,
                        no_methods_cause=jvms.unnamed_cause(pid) if jvms is not None else "",
                        native_cause=cfi.cut_cause_of(pid) if cfi is not None else None,
                    )
                    history = symbols_of.histories.get(pid)
                    table = tabulate_store(store, pid, folder, history, last)
                    stats = replace(stats, **folder.stats_fields)  # type: ignore[arg-type]
                    if jvms is not None:
                        stats = replace(stats, hotspot_steps=hotspot_steps(bpf, pid))
                    if history is not None:
                        stats = replace(stats, perf_map_snapshots=history.snapshots)
                finally:
                    if owned:
                        symbols.close()
                store.forget(pid)
                symbols_of.release_symbols(pid)
                # the symbol cache's and the naming's heap back to the kernel before the next process and the
                # writing: glibc keeps it otherwise, and the next steps stack on it
                release_freed_memory()
                symbols_of.discard_history(pid)
            result[pid] = CollectedStacks(table, stats)
    finally:
        kernel.close()
    return result, dropped_total


def collect_stackmap(
    bpf: Any, symbols_of: SymbolPreparer, targets: Iterable[int], depth: int
) -> tuple[dict[int, tuple[Counter[str], SamplerStats]], Counter[int], int]:
    """The stack map's counts folded per PID; the samples lost per reason (errno) and dropped in all."""
    stacks_table = bpf[b"stack_traces"]
    stack_cache: dict[int, tuple[int, ...]] = {}
    by_pid: dict[int, list[tuple[Any, int]]] = {}
    for key, count in _read_counts(bpf):
        by_pid.setdefault(int(key.tgid), []).append((key, count))
    kernel = KernelSymbols()
    result: dict[int, tuple[Counter[str], SamplerStats]] = {}
    lost_reasons: Counter[int] = Counter()
    dropped_total = 0
    try:
        for pid in sorted(set(targets) | set(by_pid)):
            samples, dropped = _target_counts(bpf, pid)
            dropped_total += dropped
            folded: Counter[str] = Counter()
            stats = SamplerStats(pid=pid, samples=samples, max_stack_depth=depth, dropped=dropped)
            entries = by_pid.get(pid, [])
            symbols: ProcessSymbols | None = None
            owned = False
            if entries:
                symbols, owned = symbols_of.symbols_for(pid)
            is_java = symbols_of.is_java(pid, symbols)  # no perf-map versions without the ring buffer
            try:
                for key, count in entries:
                    user_frames: list[Frame] | None = None
                    kernel_names: list[str] | None = []
                    truncated = False
                    user_id, kernel_id = int(key.user_stack_id), int(key.kernel_stack_id)
                    if user_id >= 0:
                        addrs = _stack(stacks_table, stack_cache, user_id)
                        truncated = len(addrs) >= depth
                        assert symbols is not None
                        user_frames = [symbols.resolve(a) for a in addrs]
                    else:
                        lost_reasons[-user_id] += count
                        stats = replace(stats, lost_user_stack=stats.lost_user_stack + count)
                    if kernel_id >= 0:
                        addrs = _stack(stacks_table, stack_cache, kernel_id)
                        truncated = truncated or len(addrs) >= depth
                        kernel_names = [kernel.resolve(a) for a in addrs]
                    elif kernel_id != STACK_NONE:
                        kernel_names = None
                        lost_reasons[-kernel_id] += count
                        stats = replace(stats, lost_kernel_stack=stats.lost_kernel_stack + count)
                    if truncated:
                        stats = replace(stats, truncated=stats.truncated + count)
                    if user_frames is not None and is_java_unwalkable(user_frames, truncated, is_java):
                        stats = replace(stats, java_unwalkable=stats.java_unwalkable + count)
                    comm = bytes(key.comm).split(b"\0", 1)[0].decode("utf-8", "replace")
                    user_names = [f.name for f in user_frames] if user_frames is not None else None
                    folded[fold_stack(comm, user_names, kernel_names)] += count
            finally:
                if owned and symbols is not None:
                    symbols.close()
            result[pid] = (folded, stats)
    finally:
        kernel.close()
    return result, lost_reasons, dropped_total
