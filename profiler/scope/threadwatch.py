"""Full Java thread names of the sampled JVMs through the window: a uprobe on HotSpot's thread naming.

Kernel: uprobes (CONFIG_UPROBES) and BPF ring buffers (5.8). Overhead: one event per thread start or
rename of a target JVM (Spark: one per task), nothing per sample. HotSpot's libjvm.so must keep its
``.symtab`` (Debian's and Temurin's do); without the symbol, or without an attach answer, the run goes on with the
kernel's 15-byte names for what could not be named, and a warning says which JVM and why.

Threads older than the window are seeded once from ``Thread.print`` over the attach socket (``nid`` = tid); the
uprobe is attached before that, so a rename during the reading is not lost (profiler/scope/threadnames.py
decides which of the two holds). The sampler's reader thread calls ``drain()`` before it files the
samples it just read, so every rename that precedes a sample is known when the sample is named.
"""

from __future__ import annotations

import ctypes as ct
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from ..bpf.compiler import compile_program
from ..files import procread, safeio
from .attach import AttachError, attach_command
from .jvm import is_jvm
from .threadnames import NameHistory, ThreadLabel, parse_thread_print

SET_NATIVE_THREAD_NAME = "_ZN2os22set_native_thread_nameEPKc"  # os::set_native_thread_name(const char*)
NAME_BYTES = 256
MAX_TARGETS = 4096
RINGBUF_PAGES = 64  # 256 KiB: ~1000 renames between two drains (a JVM starting names ~30 threads)
RENAME_HEADER = struct.Struct("<IIQ")  # struct rename_t of thread_names.c before the name
PRUNE_PERIOD_NS = 10 * 10**9
PRUNE_LAG_NS = 30 * 10**9  # samples reach user space within seconds; names older than this are history
JCMD_TIMEOUT = 20.0
LIBJVM_WAIT = 5.0  # seconds a JVM found at its exec may take to map libjvm.so


def libjvm_path(pid: int) -> str | None:
    """The libjvm.so a process maps, as a path this process can open that no tenant can redirect:
    /proc/PID/map_files/<range> of its first mapping (the mapped inode itself; a link swapped in at
    its path would otherwise put the uprobe on another, root-owned, file)."""
    for line in procread.maps(pid):  # bounded: MAPS_MAX_MAPPINGS mappings, a warning past them
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].endswith("/libjvm.so"):
            try:  # bcc opens the path itself: only a regular file that answered in time (not FUSE) reaches it
                start, end = (int(bound, 16) for bound in parts[0].split("-"))
                fd, _info = safeio.open_map_file(pid, start, end)
            except (OSError, ValueError):
                return None  # refused (safeio named it) or gone
            os.close(fd)
            return f"/proc/{pid}/map_files/{parts[0]}"
    return None


class ThreadWatch:
    """The uprobe program, the jcmd seeding worker and the NameHistory they fill.

    ``start()`` compiles; ``add_pid`` attaches to the process's libjvm.so (once per file) and queues
    its seeding; ``drain()`` and ``label()`` run on the sampler's reader thread only, so the history
    needs no lock (seeds reach it through a queue). ``warnings`` is the sampler's end-of-run list.
    """

    def __init__(self, warnings: list[str], jcmd: Callable[[int], str] | None = None) -> None:
        self.history = NameHistory()
        self.mode = "comm"  # "uprobe" once a libjvm.so is attached; meta.json's thread_names
        self._warnings = warnings
        self._jcmd = jcmd or _thread_print
        self._bpf: Any = None
        self._callback: Any = None
        self._attached: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of a libjvm.so -> its path
        self._pids: set[int] = set()
        self._awaiting: set[int] = set()  # processes whose jcmd seed is still to come
        self._seeds: queue.SimpleQueue[tuple[int, dict[int, str], int]] = queue.SimpleQueue()
        self._jobs: queue.Queue[tuple[int, str | None] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._next_prune = 0
        self.events_lost = 0
        self.seeded = 0  # processes whose names jcmd read

    def bpf_text(self) -> str:
        source = resources.files("profiler.scope").joinpath("thread_names.c").read_text(encoding="utf-8")
        values = {"NAME_BYTES": NAME_BYTES, "MAX_TARGETS": MAX_TARGETS, "RINGBUF_PAGES": RINGBUF_PAGES}
        return "".join(f"#define {key} {value}\n" for key, value in values.items()) + source

    def start(self) -> None:
        """Compile the uprobe program; a failure leaves kernel names and a warning, never an error."""
        try:
            from bcc import BPF

            self._bpf = compile_program(BPF, self.bpf_text())
            self._callback = self._on_rename  # bcc keeps only a C pointer
            self._bpf[b"renames"].open_ring_buffer(self._callback)
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception; thread names are optional
            self._bpf = None
            self._warnings.append(
                f"thread renames not watched (profiler/scope/thread_names.c did not load: {str(exc).strip()[:160]}); "
                "threads keep the kernel's 15-character names unless jcmd names them; check uprobes (profiler doctor)"
            )
        self._worker = threading.Thread(target=self._seed_loop, name="thread-names", daemon=True)
        self._worker.start()

    def add_pid(self, pid: int) -> None:
        """Watch a sampled process: attach to its libjvm.so (a non-JVM has none: nothing to do), then seed."""
        if pid in self._pids:
            return
        self._pids.add(pid)
        path = libjvm_path(pid)
        if path is None and not is_jvm(pid):
            return
        if path is not None:
            self._watch(pid, path)
        # a JVM found at its exec maps libjvm.so a moment later: the worker attaches then (path None)
        self._awaiting.add(pid)
        self._jobs.put((pid, path))

    def _watch(self, pid: int, path: str) -> None:
        if self._bpf is not None and self._attach(pid, path):
            targets = self._bpf[b"targets"]
            targets[targets.Key(pid)] = ct.c_uint8(1)

    def _attach(self, pid: int, path: str) -> bool:
        try:
            status = os.stat(path)
        except OSError as exc:
            self._warnings.append(f"pid {pid}: {path} unreadable ({exc.strerror}); thread renames not watched")
            return False
        key = (status.st_dev, status.st_ino)
        if key in self._attached:
            return True
        try:
            self._bpf.attach_uprobe(
                name=path.encode(), sym=SET_NATIVE_THREAD_NAME.encode(), fn_name=b"on_set_native_thread_name"
            )
        except Exception as exc:  # noqa: BLE001 - a stripped libjvm.so has no such symbol
            self._warnings.append(
                f"pid {pid}: {path.split('/root', 1)[-1]} has no symbol os::set_native_thread_name "
                f"({str(exc).strip()[:100]}); renames during the window not seen: samples keep the names jcmd "
                "read at the start, else the kernel's 15 characters; use a JDK whose libjvm.so keeps .symtab"
            )
            self._attached[key] = ""
            return False
        self._attached[key] = path
        self.mode = "uprobe"
        return True

    def _seed_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            pid, path = job
            try:
                if path is None:
                    path = _wait_for_libjvm(pid)
                    if path is None:
                        continue  # exited, or not HotSpot: kernel names
                    self._watch(pid, path)
                text = self._jcmd(pid)
                self._seeds.put((pid, parse_thread_print(text), time.monotonic_ns()))
            except (OSError, ValueError) as exc:
                self._warnings.append(
                    f"pid {pid}: Thread.print over the attach socket failed ({str(exc)[:120]}); threads older "
                    "than the window keep "
                    "the kernel's 15-character names until they are renamed"
                )
            finally:
                self._awaiting.discard(pid)  # after the seed is queued: see awaiting()

    def awaiting(self) -> frozenset[int]:
        """Processes whose seed has not been queued yet. Read it before drain(): a process not in it
        then has its seed (if any) filed by that drain, so its samples can be named."""
        return frozenset(self._awaiting)

    def _on_rename(self, _ctx: Any, data: Any, size: int) -> int:
        try:
            raw = ct.string_at(data, size)
            tgid, tid, time_ns = RENAME_HEADER.unpack_from(raw)
            name = raw[RENAME_HEADER.size :].split(b"\0", 1)[0].decode("utf-8", "replace")
            if name:
                self.history.renamed(tgid, tid, time_ns, name)
        except Exception:  # noqa: BLE001 - one odd record must not stop the drain
            self.events_lost += 1
        return 0

    def drain(self, now_ns: int | None = None) -> None:
        """File the renames and seeds that arrived; called by the sampler's reader before it files samples."""
        while True:
            try:
                pid, names, read_at = self._seeds.get_nowait()
            except queue.Empty:
                break
            self.history.seed(pid, names, read_at)
            self.seeded += 1
        if self._bpf is not None:
            self._bpf.ring_buffer_consume()
        now_ns = now_ns if now_ns is not None else time.monotonic_ns()
        if now_ns >= self._next_prune:
            self.history.prune(now_ns - PRUNE_LAG_NS)
            self._next_prune = now_ns + PRUNE_PERIOD_NS

    def label(self, tgid: int, tid: int, time_ns: int, comm: bytes) -> ThreadLabel:
        return self.history.label(tgid, tid, time_ns, comm)

    def stop(self) -> None:
        """End the seeding worker (waits for a jcmd under way) and file what is left."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout=JCMD_TIMEOUT + 5)
            self._worker = None
        self._awaiting.clear()
        if self._bpf is not None:
            lost = self._bpf[b"lost"]
            self.events_lost += int(lost[lost.Key(0)].value)
            lost[lost.Key(0)] = lost.Leaf(0)
            if self.events_lost:
                self._warnings.append(
                    f"{self.events_lost} thread renames lost (ring buffer full); those samples keep kernel names"
                )

    def close(self) -> None:
        """Detach and free the program. Idempotent."""
        self.stop()
        if self._bpf is None:
            return
        try:
            # bcc's own detach also deletes a tracefs entry that perf-attached uprobes never had (and
            # fails where tracefs is not mounted): closing the perf event is the whole detach.
            from bcc import lib

            for event, fd in list(self._bpf.uprobe_fds.items()):
                lib.bpf_close_perf_event_fd(fd)
                self._bpf._del_uprobe_fd(event)
            self._bpf.cleanup()
        finally:
            self._bpf = None

    @property
    def bpf(self) -> Any:
        """The loaded bcc object (None when not loaded): its programs count in the profiler's overhead."""
        return self._bpf


def _wait_for_libjvm(pid: int, seconds: float = LIBJVM_WAIT) -> str | None:
    deadline = time.monotonic() + seconds
    while (path := libjvm_path(pid)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return path


def _thread_print(pid: int) -> str:
    """``Thread.print`` through the attach socket (no program run; a JVM that answers only its own user
    is asked from inside its namespaces as that user, see profiler.scope.attach)."""
    try:
        status, output = attach_command(pid, "jcmd", "Thread.print", timeout=JCMD_TIMEOUT)
    except AttachError as exc:
        raise ValueError(exc.message) from None
    if status != 0:
        lines = output.strip().splitlines()
        raise ValueError(lines[-1][:200] if lines else f"attach status {status}")
    return output
