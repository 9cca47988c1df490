"""Each sampled process's preparation for the walker, beside sampling: its unwind tables (.eh_frame, the
CFI loader's) and its JVM's vmStructs and code cache (published to the BPF program), built in worker
threads with a deadline per target, so that the first sample never waits for them and one slow or crafted
target delays only itself.

A target is sampled from the moment it is added; until its preparation is done its stacks are walked by
frame pointers only (native frames without them cut the stack, JIT and interpreted frames unnamed). A
preparation holds a worker's slot for a lease of a few seconds only while others wait: past it, it goes on
beside the next target (up to ``workers + max_late`` preparations at once), so a slow or crafted target
delays the ones queued behind it by its lease, not by its deadline. A preparation still running at its
deadline is reported once (``pid N: ... late``) and, should it finish, still publishes what it built; one
that fails is reported once too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..bpf.compiler import release_freed_memory
from ..unwind.cfi import CfiLoader
from ..unwind.codecache import CodeCacheLayout
from ..unwind.cpython import PyTarget, PythonTargets, fill_python
from ..unwind.debugflag import ExactInlining
from ..unwind.hotspot import JvmNames, VMLayout
from ..unwind.tablecache import TableCache
from ..unwind.vmstructs import libjvm_mapping

PREPARE_SECONDS = 20.0  # a target's preparation (unwind tables, vmStructs) past this is reported late
PREPARE_WORKERS = 2  # targets prepared at once: the host's cores are the workload's
PREPARE_LEASE = 2.0  # seconds a preparation keeps its slot while other targets wait (an honest JVM's takes ~1 s)
MAX_LATE = 8  # preparations past their deadline and still running; beyond, new targets are refused theirs
WHAT = "unwind preparation (CFI tables, JVM vmStructs)"


@dataclass(frozen=True)
class PreparationLimits:
    """How long a target's preparation may take and how many run at once (the module's docstring)."""

    deadline: float = PREPARE_SECONDS
    workers: int = PREPARE_WORKERS
    max_late: int = MAX_LATE
    lease: float = PREPARE_LEASE


class TargetPreparation:
    """Runs ``prepare(pid)`` once for every submitted pid, each in its own worker thread, at most ``workers``
    at once, dispatched by a supervisor thread that also watches the deadlines.

    ``prepare`` raises to fail; what it publishes it publishes itself (under the BPF object's lock). The
    warnings go to ``warnings`` (one line per target that was late, failed or refused). Past ``lease``
    seconds a running preparation gives its slot to a waiting target and goes on beside it, as long as fewer
    than ``workers + max_late`` run in all.
    """

    def __init__(
        self, prepare: Callable[[int], None], warnings: list[str], limits: PreparationLimits = PreparationLimits()
    ) -> None:
        self._prepare = prepare
        self._warnings = warnings
        self.limits = limits
        self._cond = threading.Condition()
        self._waiting: deque[int] = deque()
        self._running: dict[int, float] = {}  # pid -> its deadline (time.monotonic()), every one not late yet
        self._holding: dict[int, float] = {}  # pid -> the end of its lease, the running ones holding a slot
        self._late: set[int] = set()  # past their deadline, still running
        self.outcomes: dict[int, str] = {}  # pid -> "queued", "running", "ready", "failed", "late", "refused"
        self._supervisor: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._cond:
            if self._supervisor is not None or self._stopped:
                return
            self._supervisor = threading.Thread(target=self._supervise, name="target-preparation", daemon=True)
            self._supervisor.start()

    def submit(self, pid: int) -> None:
        """Prepare ``pid`` in a worker (once: a pid already submitted is not prepared again)."""
        with self._cond:
            if pid in self.outcomes or self._stopped:
                return
            self.outcomes[pid] = "queued"
            self._waiting.append(pid)
            self._cond.notify_all()

    def wait(self, pids: Iterable[int], timeout: float) -> bool:
        """Block until every pid of ``pids`` is prepared, failed, late or refused (at most ``timeout`` s);
        True when none is still queued or running. For callers that need the tables before they sample."""
        wanted = set(pids)
        end = time.monotonic() + timeout
        with self._cond:
            while any(self.outcomes.get(pid) in ("queued", "running") for pid in wanted):
                left = end - time.monotonic()
                if left <= 0 or self._stopped:
                    return False
                self._cond.wait(left)
        return True

    def stop(self, join: float = 1.0) -> None:
        """No new work; the supervisor ends (workers still running are daemons and publish nothing once the
        sampler has stopped)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.join(timeout=join)

    def _supervise(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                self._mark_late(now)
                self._end_leases(now)
                self._dispatch(now)
                leases = self._holding.values() if self._waiting else ()
                due = min((*self._running.values(), *leases), default=None)
                self._cond.wait(None if due is None else max(0.0, due - now))

    def _mark_late(self, now: float) -> None:
        for pid, due in list(self._running.items()):
            if now >= due:
                del self._running[pid]  # its slot goes to the next target
                self._holding.pop(pid, None)
                self._late.add(pid)
                self.outcomes[pid] = "late"
                self._warnings.append(
                    f"pid {pid}: {WHAT} not done after {self.limits.deadline:g} s; sampled meanwhile, its frames "
                    "unnamed where its tables are not ready (a slow or crafted target; the others go on)"
                )

    def _end_leases(self, now: float) -> None:
        """Preparations past their lease go on without a slot while targets wait and room is left."""
        for pid, lease_end in list(self._holding.items()):
            room = len(self._running) + len(self._late) < self.limits.workers + self.limits.max_late
            if self._waiting and room and now >= lease_end:
                del self._holding[pid]
                self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        while self._waiting and len(self._holding) < self.limits.workers:
            pid = self._waiting.popleft()
            if len(self._late) >= self.limits.max_late:
                self.outcomes[pid] = "refused"
                self._warnings.append(
                    f"pid {pid}: {WHAT} refused: {len(self._late)} preparations still run past their deadline; "
                    "its samples kept, walked by frame pointers only"
                )
                continue
            self._running[pid] = now + self.limits.deadline
            self._holding[pid] = now + self.limits.lease
            self.outcomes[pid] = "running"
            worker = threading.Thread(target=self._work, args=(pid,), name=f"prepare-{pid}", daemon=True)
            worker.start()
        self._cond.notify_all()

    def _work(self, pid: int) -> None:
        failure = None
        try:
            self._prepare(pid)
        except Exception as exc:  # noqa: BLE001 - a target's failure is its warning, never the run's
            failure = f"{exc.__class__.__name__}: {str(exc).strip()[:160]}"
        with self._cond:
            late = pid in self._late
            self._late.discard(pid)
            self._running.pop(pid, None)
            self._holding.pop(pid, None)
            self.outcomes[pid] = "failed" if failure else "ready"
            if failure and not late:  # a late one had its line
                self._warnings.append(
                    f"pid {pid}: {WHAT} failed ({failure}); its samples kept, frames unnamed where its tables "
                    "are missing"
                )
            self._cond.notify_all()


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


def publish_jvm(jvms: Any, pid: int, layout: VMLayout, unloads_address: int, code_cache: bool) -> None:
    """``pid``'s interpreter (and its code cache when ``code_cache``) into the walker's ``jvms`` map; the
    caller holds the BPF object's lock."""
    entry = jvms.Leaf()
    entry.interpreter_start, entry.interpreter_end = layout.interpreter
    entry.method_slot = layout.method_slot
    entry.sender_sp_slot = layout.sender_sp_slot
    entry.unloads_at = unloads_address
    code = layout.code_cache if code_cache else None
    if code is not None:
        fill_code_cache(entry, code)
    jvms[jvms.Key(pid)] = entry


class WalkerTargets:
    """What the walker knows of each sampled process, prepared beside sampling by a TargetPreparation and
    published into the BPF program's maps: its JVM's vmStructs and code cache (JvmNames), its CPython's frames
    (PythonTargets), its unwind tables (a CfiLoader, from start_tables()) and, with --exact-inlining,
    DebugNonSafepoints written into its JVM (put back by stop()).

    Nothing is prepared unless ``walking()`` (the program loaded our walker, stack_walk "bpf"). ``live()``
    gives the BPF object while its perf events are attached, else None; it is called under ``maps_lock``,
    held by every user of the BPF object's maps (bcc's objects are not thread-safe).
    """

    def __init__(
        self,
        walking: Callable[[], bool],
        live: Callable[[], Any],
        maps_lock: threading.Lock,
        warnings: list[str],
        hotspot_unwind: bool = True,
        exact_inlining: bool = False,
    ) -> None:
        self.walking = walking
        self._live = live
        self._maps_lock = maps_lock
        self.warnings = warnings
        self.hotspot_unwind = hotspot_unwind  # JIT frames stepped by their CodeBlob (else frame pointers only)
        self.jvms = JvmNames(self._publish_jvm)
        self.pythons = PythonTargets(self._publish_python)  # CPython frames (profiler/unwind/cpython.py)
        self.preparation = TargetPreparation(self.prepare, warnings)
        self.cfi: CfiLoader | None = None  # unwind tables for the walker (profiler/unwind/cfi.py)
        self._exact = ExactInlining() if exact_inlining else None

    def start_tables(self, bpf: Any) -> None:
        """The program is loaded: the unwind tables' loader starts, refreshing them in its own thread."""
        if self.walking():
            self.cfi = CfiLoader(bpf, table_cache=TableCache.configured())
            self.cfi.start()

    def start(self) -> None:
        """The preparation workers start (add_pid() submits each target)."""
        if self.walking():
            self.preparation.start()

    def attach_jvm(self, pid: int) -> bool:
        """A JVM entered the scope (a worker): its vmStructs read so that the walker names interpreted frames."""
        return self.walking() and self.jvms.attach(pid)

    def prepare(self, pid: int) -> None:
        """A target's preparation (a worker): its JVM's vmStructs first (milliseconds; the walker then steps
        its JIT frames, most of a JVM's stack), then its unwind tables (libjvm.so's: ~1.7 CPU-s parsed, ~0.06
        from the table cache)."""
        is_jvm = self.attach_jvm(pid)  # False for a process that is no JVM (reason kept in jvms.errors)
        if not is_jvm and self.walking():
            self.pythons.attach(pid)  # False for a process that is no CPython (reason kept in pythons.errors)
        exact = self._exact if self._exact and (is_jvm or libjvm_mapping(pid) is not None) else None
        if exact is not None and (warning := exact.apply(pid)) is not None:  # none once stop() put them back
            self.warnings.append(f"pid {pid}: {warning}")
        if self.cfi is not None:
            self.cfi.load_pid(pid)
        release_freed_memory()  # the tables' parse: glibc would keep its heap

    def submit(self, pid: int) -> None:
        """Prepare ``pid`` in a worker with a deadline, beside its sampling."""
        if self.walking():
            self.preparation.submit(pid)

    def wait(self, pids: Sequence[int], wait: float) -> bool:
        """Submit ``pids`` and wait up to ``wait`` seconds for their preparations: True when all were done (or
        given up) in time, or without the walker."""
        if not self.walking():
            return True
        for pid in pids:
            self.preparation.submit(pid)
        return self.preparation.wait(pids, wait)

    def jit_walkable(self, pid: int) -> bool:
        """The walker steps ``pid``'s JIT frames by their CodeBlobs (no frame pointers needed)."""
        namer = self.jvms.namers.get(pid)
        return self.walking() and self.hotspot_unwind and namer is not None and namer.layout.code_cache is not None

    def _publish_jvm(self, pid: int, layout: VMLayout, unloads_address: int) -> None:
        """Tell the walker where ``pid``'s interpreter and code cache are (a worker): never once stopped."""
        with self._maps_lock:
            publish_jvm(self._attached()[b"jvms"], pid, layout, unloads_address, self.hotspot_unwind)

    def _publish_python(self, pid: int, target: PyTarget) -> None:
        """Tell the walker where ``pid``'s CPython keeps its frames (a worker): never once stopped."""
        with self._maps_lock:
            pythons = self._attached()[b"pythons"]
            entry = pythons.Leaf()
            fill_python(entry, target)
            pythons[pythons.Key(pid)] = entry

    def _attached(self) -> Any:
        bpf = self._live()
        if bpf is None:
            raise RuntimeError("sampler not started or already stopped")
        return bpf

    def forget(self, pid: int, bpf: Any) -> None:
        """``pid`` exited: a later process with its pid is not that JVM or CPython, nor has its tables."""
        if bpf is not None and self.walking():
            with self._maps_lock:
                for name in (b"jvms", b"pythons"):
                    table = bpf[name]
                    try:
                        del table[table.Key(pid)]
                    except KeyError:
                        pass
        if self.cfi is not None:
            self.cfi.forget_pid(pid)

    def stop_preparation(self) -> None:
        """No more preparations; DebugNonSafepoints put back in every JVM that had it written."""
        self.preparation.stop()
        if self._exact is not None:
            self._exact.restore_all()

    def stop_tables(self) -> None:
        """The unwind tables' loader stops; its refusals (a table over its budget, a mapping not listed) become
        the run's warnings."""
        if self.cfi is not None:
            self.cfi.stop()
            self.warnings.extend(w for w in self.cfi.warnings if w not in self.warnings)

    def close(self) -> None:
        self.jvms.close()
        self.pythons.close()
