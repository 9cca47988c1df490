"""The stack sampler's BPF program: its sizes, its generated C text (``--print-bpf``), the depth sysctl it
raises for its lifetime, and the kernel ids of what it loaded. StackSampler (sampler.py) compiles and
attaches it."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import time
from importlib import resources
from typing import Any

from ..bpf.compiler import compile_program
from ..bpf.defines import with_defines
from ..errors import ConfigError
from ..unwind.cfi import CfiLoader

STACK_NONE = -1  # kernel stack not asked for (user-mode sample); see stack_sampler.c
MAX_TARGETS = 4096
PERF_EVENT_MAX_STACK = "/proc/sys/kernel/perf_event_max_stack"
COLLECTIONS = ("auto", "ringbuf", "stackmap")
STACK_WALKS = ("auto", "bpf", "kernel")  # bpf: our walker (stack_walk.c); kernel: bpf_get_stack
DEFAULT_DEPTH = {"bpf": 1024, "kernel": 127}  # frames kept per user stack when --max-stack-depth is not given
CHUNK_FRAMES = 32  # frames per program of the walker's tail-call chain (the HotSpot step: dear to verify)
WALK_LIMIT = CHUNK_FRAMES * 33  # 33 tail calls of walk_more (the kernel's MAX_TAIL_CALL_CNT): on_cpu_clock walks none
KERNEL_STACK_DEPTH_MAX = 127  # kernel stacks are short; the user depth is the one users raise
RINGBUF_SECONDS = 2.0  # the buffer holds this long of samples at full rate: ten drain periods
RINGBUF_MIN_PAGES, RINGBUF_MAX_PAGES = 256, 65536  # 1 MiB .. 256 MiB with 4 KiB pages
SOURCES = {"walker": "stack_walk.c", "ringbuf": "stack_ringbuf.c", "stackmap": "stack_sampler.c"}
# A blocked thread's walk (offcpu_trace.c in the walker's program): the leaf-most and root-most frames kept
# (a record of 1 KiB per distinct stack) and the frames walked at most (8 tail calls of offcpu_walk_more).
OFFCPU_LEAF_SLOTS, OFFCPU_ROOT_SLOTS = 96, 32
OFFCPU_WALK_LIMIT = CHUNK_FRAMES * 8


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


def walk_slots(max_stack_depth: int) -> tuple[int, int]:
    """(leaf, root) frames the walker keeps of a stack deeper than ``max_stack_depth``: a quarter for the
    root end (a power of two: the ring's index is masked), the rest for the leaf end."""
    root = 1
    while root * 2 <= max(1, max_stack_depth // 4):
        root *= 2
    return max_stack_depth - root, root


def ringbuf_pages(frequency: int, record_size: int, cpus: int | None = None) -> int:
    """A power of two of pages holding RINGBUF_SECONDS of samples from every CPU."""
    cpus = cpus or os.cpu_count() or 1
    wanted = frequency * cpus * record_size * RINGBUF_SECONDS / 4096
    pages = RINGBUF_MIN_PAGES
    while pages < wanted and pages < RINGBUF_MAX_PAGES:
        pages *= 2
    return pages


def program_text(collection: str, values: dict[str, int]) -> str:
    """The C of ``collection``'s program ("walker", "ringbuf" or "stackmap") with its sizes defined and its
    headers inlined, so that --print-bpf shows the whole program and bcc needs no include path."""
    package = resources.files("profiler.sampling")
    source = package.joinpath(SOURCES[collection]).read_text(encoding="utf-8")
    source = source.replace('#include "targets.h"\n', package.joinpath("targets.h").read_text(encoding="utf-8"))
    source = source.replace('#include "cfi_step.h"\n', CfiLoader.bpf_header())
    hotspot_header = resources.files("profiler.unwind").joinpath("hotspot_step.h").read_text(encoding="utf-8")
    source = source.replace('#include "hotspot_step.h"\n', hotspot_header)
    python_header = resources.files("profiler.unwind").joinpath("python_step.h").read_text(encoding="utf-8")
    source = source.replace('#include "python_step.h"\n', python_header)
    return with_defines(values, source)


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
        except (OSError, ValueError, IndexError):
            continue
    return ids


class SamplerProgram:
    """The sampler's BPF program as asked (``requested_*``) and as loaded: which walk and collection,
    how deep, how large its maps; ``load()`` compiles the first that loads and says why in ``warnings``."""

    def __init__(
        self,
        warnings: list[str],
        frequency: int,
        max_stack_depth: int | None,
        stack_storage_size: int,
        count_map_size: int | None,
        collection: str,
        stack_walk: str,
    ) -> None:
        if stack_walk not in STACK_WALKS:
            raise ConfigError(f"stack walk {stack_walk!r}: use one of {', '.join(STACK_WALKS)}")
        if collection == "stackmap" and stack_walk == "bpf":
            raise ConfigError("--stack-walk bpf needs the ring buffer: drop --stack-collection stackmap")
        self.warnings = warnings
        self.requested_walk = "kernel" if collection == "stackmap" else stack_walk
        self.stack_walk = "kernel" if self.requested_walk == "kernel" else "bpf"  # what load() loaded
        self.requested_depth = max_stack_depth
        if max_stack_depth is None:
            max_stack_depth = DEFAULT_DEPTH[self.stack_walk]
        if frequency <= 0:
            raise ConfigError(f"frequency {frequency}: must be a positive number of Hz; use e.g. --frequency 99")
        if not 1 <= max_stack_depth <= 65535:
            raise ConfigError(f"max stack depth {max_stack_depth}: must be 1..65535; use e.g. 127 or 512")
        if stack_storage_size <= 0:
            raise ConfigError(f"stack storage size {stack_storage_size}: must be positive; use e.g. 16384")
        if collection not in COLLECTIONS:
            raise ConfigError(f"stack collection {collection!r}: use one of {', '.join(COLLECTIONS)}")
        self.frequency = frequency
        self.depth_limit = StackDepthLimit(max_stack_depth)
        self.max_stack_depth = max_stack_depth  # what the kernel allowed; set by load()
        self.stack_storage_size = stack_storage_size
        self.count_map_size = count_map_size or max(4 * stack_storage_size, 16384)
        self.requested_collection = collection
        self.collection = "stackmap" if collection == "stackmap" else "ringbuf"  # what load() loaded
        # the off-CPU tracer's program (offcpu_trace.c with its defines), compiled into the walker's so that
        # blocked threads are walked by the same code and tables (``offcpu_walker``: whether it loaded)
        self.offcpu_text: str | None = None
        self.offcpu_walker = False

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
        return walk_slots(self.max_stack_depth)

    def ringbuf_pages(self, cpus: int | None = None) -> int:
        return ringbuf_pages(self.frequency, self.record_size, cpus)

    def bpf_text(self, collection: str | None = None) -> str:
        """The generated BPF C, as compiled (``--print-bpf``)."""
        collection = collection or self.collection
        values = {"MAX_TARGETS": MAX_TARGETS}
        if collection == "walker":
            leaf, root = self.walk_slots
            values |= {"LEAF_SLOTS": leaf, "ROOT_SLOTS": root, "WALK_LIMIT": max(WALK_LIMIT, self.max_stack_depth)}
            values |= {"CHUNK_FRAMES": CHUNK_FRAMES, "KERNEL_STACK_DEPTH": self.kernel_stack_depth}
            values["RINGBUF_PAGES"] = self.ringbuf_pages()
            if self.offcpu_text is not None:
                return program_text(collection, values) + self._offcpu_part()
        elif collection == "ringbuf":
            values |= {"MAX_STACK_DEPTH": self.max_stack_depth, "KERNEL_STACK_DEPTH": self.kernel_stack_depth}
            values["RINGBUF_PAGES"] = self.ringbuf_pages()
        else:
            collection = "stackmap"
            values |= {"MAX_STACK_DEPTH": self.max_stack_depth, "STACK_STORAGE_SIZE": self.stack_storage_size}
            values["COUNTS_SIZE"] = self.count_map_size
        return program_text(collection, values)

    def _offcpu_part(self) -> str:
        """The off-CPU program as part of the walker's: its walk's sizes, then its text."""
        sizes = {
            "OFFCPU_WALKER": 1, "OFFCPU_LEAF_SLOTS": OFFCPU_LEAF_SLOTS, "OFFCPU_ROOT_SLOTS": OFFCPU_ROOT_SLOTS,
            "OFFCPU_WALK_LIMIT": OFFCPU_WALK_LIMIT,
        }  # fmt: skip
        return "\n" + with_defines(sizes, str(self.offcpu_text))

    def load(self, bpf_class: Any) -> Any:
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
                    self.depth_limit = StackDepthLimit(self.max_stack_depth)  # not the walker's deeper default
        self.max_stack_depth = self.depth_limit.apply(self.warnings)
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
        """The walker and its tail-call chain (walk_more in walk_progs[0]); with the off-CPU program, its
        chain too (offcpu_walk_more in offcpu_walk_progs[0]), else the walker alone and a warning."""
        self.collection = "ringbuf"
        self.stack_walk = "bpf"
        if self.offcpu_text is not None:
            try:
                bpf = self._compile_walker(bpf_class)
                self.offcpu_walker = True
                return bpf
            except Exception as exc:  # noqa: BLE001 - bcc raises Exception for compile and verifier refusals
                self.offcpu_text = None
                self.warnings.append(
                    f"off-CPU stacks by the walker unavailable ({str(exc).strip()[-120:]}); blocked threads' stacks "
                    "walked by frame pointers instead (Java frames without them unnamed)"
                )
        return self._compile_walker(bpf_class)

    def _compile_walker(self, bpf_class: Any) -> Any:
        bpf = compile_program(bpf_class, self.bpf_text("walker"))
        try:
            more = bpf.load_func(b"walk_more", bpf_class.PERF_EVENT)
            bpf[b"walk_progs"][ct.c_int(0)] = ct.c_int(more.fd)
            bpf.load_func(b"on_cpu_clock", bpf_class.PERF_EVENT)
            if self.offcpu_text is not None:
                blocked = bpf.load_func(b"offcpu_walk_more", bpf_class.RAW_TRACEPOINT)
                bpf[b"offcpu_walk_progs"][ct.c_int(0)] = ct.c_int(blocked.fd)
        except Exception:
            bpf.cleanup()
            raise
        return bpf

    def drop_tail_calls(self, bpf: Any) -> None:
        """Empty the walker's tail-call array now: the kernel drops the array's hold on walk_more only in
        deferred work after the map's last fd closes, so the program would outlive close() for a moment."""
        if self.stack_walk != "bpf" or bpf is None:
            return
        for table in (b"walk_progs", b"offcpu_walk_progs") if self.offcpu_walker else (b"walk_progs",):
            try:
                del bpf[table][ct.c_int(0)]
            except (KeyError, OSError):
                pass

    def source_name(self) -> str:
        if self.stack_walk == "bpf":
            return "profiler/sampling/stack_walk.c"
        return f"profiler/sampling/{SOURCES[self.collection]}"
