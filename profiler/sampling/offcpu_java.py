"""The JVM's side of off-CPU stacks: for each traced HotSpot JVM, its vmStructs offsets in offcpu_trace.c's
``java_layouts`` and its threads' JavaThread addresses in ``java_threads``, refreshed while the window
runs (threads come and go); after the window, the names of the last Java frames the program stored.

A process that is no HotSpot JVM (or whose vmStructs lack a field) is simply not followed: its blocks
keep the kernel's and the stack's cause.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from ..capture.offcpu import JAVA_NONE
from ..errors import VMStructsError
from ..unwind.hotspot import MethodNamer, open_namer
from ..unwind.javathreads import (
    ThreadLayout,
    host_tids,
    java_frame_name,
    read_java_threads,
    read_thread_view,
    thread_layout,
)

REFRESH_SECONDS = 1.0  # a thread started since the last refresh keeps the kernel's cause until the next


class JavaThreadWatch:
    """Keeps ``java_layouts``/``java_threads`` of a loaded offcpu_trace.c program in step with the JVMs."""

    def __init__(
        self,
        bpf: Any,
        refresh_seconds: float = REFRESH_SECONDS,
        borrow: Callable[[int], MethodNamer | None] | None = None,
    ) -> None:
        self._bpf = bpf
        self._borrow = borrow  # a namer another component opened (the sampler's): used, never closed here
        self._owned: set[int] = set()  # pids whose namer this watch opened (and closes)
        self._refresh_seconds = refresh_seconds
        self._jvms: dict[int, tuple[MethodNamer, ThreadLayout]] = {}
        self._threads: dict[int, dict[int, int]] = {}  # pid -> host tid -> JavaThread, as in java_threads
        self._names: dict[tuple[int, int], str | None] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def attach(self, pid: int) -> bool:
        """Follow ``pid``'s threads if it is a HotSpot JVM whose vmStructs have what offcpu_trace.c reads."""
        namer = self._borrow(pid) if self._borrow is not None else None
        owned = namer is None
        if namer is None:
            try:
                namer = open_namer(pid)
            except (VMStructsError, OSError):
                return False  # not a JVM (or gone): nothing to follow
        layout = thread_layout(namer.layout)
        if layout is None:
            if owned:
                namer.memory.close()
            self.errors.append(
                f"off-cpu: pid {pid}: the JVM's vmStructs lack its threads' fields; its causes are the kernel's only"
            )
            return False
        table = self._bpf[b"java_layouts"]
        value = table.Leaf()
        value.interpreter_start, value.interpreter_end = layout.interpreter
        value.method_slot = layout.method_slot
        value.last_java_sp, value.last_java_pc, value.last_java_fp = (
            layout.last_java_sp, layout.last_java_pc, layout.last_java_fp
        )
        value.pending_monitor, value.waiting_monitor = layout.pending_monitor, layout.waiting_monitor
        with self._lock:
            self._jvms[pid] = (namer, layout)
            if owned:
                self._owned.add(pid)
            table[ctypes.c_uint32(pid)] = value
        self._refresh_pid(pid)
        return True

    def _refresh_pid(self, pid: int) -> None:
        with self._lock:
            known = self._jvms.get(pid)
            if known is None:
                return
            namer, layout = known
            try:
                threads = read_java_threads(namer.memory, layout)
            except VMStructsError:
                threads = {}
            to_host = host_tids(pid)
            if to_host is None:  # our pid namespace: the JVM's ids are ours
                current = threads
            else:  # a container's: only the threads whose host id is known (never another process's id)
                current = {to_host[tid]: address for tid, address in threads.items() if tid in to_host}
            table = self._bpf[b"java_threads"]
            written = self._threads.get(pid, {})
            for tid in written.keys() - current.keys():
                try:
                    del table[ctypes.c_uint32(tid)]
                except KeyError:
                    pass
            for tid, address in current.items():  # only what changed: most threads outlive many refreshes
                if written.get(tid) != address:
                    table[ctypes.c_uint32(tid)] = ctypes.c_uint64(address)
            self._threads[pid] = dict(current)

    def detach(self, pid: int) -> None:
        """Stop following ``pid`` (it exited: a later process given the same pid is another)."""
        with self._lock:
            known = self._jvms.pop(pid, None)
            if known is None:
                return
            if pid in self._owned:
                self._owned.discard(pid)
                known[0].memory.close()
            for tid in self._threads.pop(pid, {}):
                try:
                    del self._bpf[b"java_threads"][ctypes.c_uint32(tid)]
                except KeyError:
                    pass
            try:
                del self._bpf[b"java_layouts"][ctypes.c_uint32(pid)]
            except KeyError:
                pass

    def start(self) -> None:
        """Refresh every JVM's threads in the background until stop()."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="offcpu-java-threads", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self._refresh_seconds):
            with self._lock:
                pids = list(self._jvms)
            for pid in pids:
                self._refresh_pid(pid)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def view_for(self, pid: int) -> Callable[[int], tuple[int, int]]:
        """tid -> (java_state, java_frame) of ``pid``'s thread now, as offcpu_trace.c reads it at a switch-out
        ((JAVA_NONE, 0): not a followed JVM's thread). For threads blocked now (offcpu_idle.py)."""
        with self._lock:
            known = self._jvms.get(pid)
            threads = dict(self._threads.get(pid, {}))
        if known is None:
            return lambda _tid: (JAVA_NONE, 0)
        namer, layout = known

        def view(tid: int) -> tuple[int, int]:
            address = threads.get(tid)
            return read_thread_view(namer.memory, layout, address) if address else (JAVA_NONE, 0)

        return view

    def namer_for(self, pid: int) -> Callable[[int], str | None]:
        """Names of ``pid``'s stored last Java frames (None: not a followed JVM, or not nameable)."""
        known = self._jvms.get(pid)
        if known is None:
            return lambda _frame: None
        namer = known[0]

        def name(frame: int) -> str | None:
            key = (pid, frame)
            if key not in self._names:
                self._names[key] = java_frame_name(namer, frame)
            return self._names[key]

        return name

    def close(self) -> None:
        self.stop()
        with self._lock:
            for pid, (namer, _layout) in self._jvms.items():
                if pid in self._owned:
                    namer.memory.close()
            self._jvms.clear()
            self._owned.clear()
