"""The stack sampler's symbol-preparation worker: JVM perf maps and symbol caches of the sampled processes.

A background thread takes each process that entered the scope, dumps its JVM's perf map (Compiler.perfmap
on JDK 17+, the JVMTI agent on older JDKs; retried while a just-started JVM is not attachable yet) and
builds an eager symbol cache, used if the process is gone at collection. With the ring buffer it also
re-dumps every live JVM's map every ``perf_map_refresh`` seconds and keeps each version
(profiler/symbols/perfmap_history.py), so every sample is named with the JIT code of its time.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..capture.checkpoint import start_ticks
from ..scope import jvm
from . import perfmap
from .perfmap_history import PerfMapHistory
from .procsyms import ProcessSymbols

PFP_FIX = "-XX:+PreserveFramePointer (Spark: spark.executor.extraJavaOptions=-XX:+PreserveFramePointer)"
PERF_MAP_MODES = ("auto", "jcmd", "agent", "none")


@dataclass
class _Prepared:
    """What prepare_symbols learned about one process while it was alive."""

    jvm_info: jvm.JvmInfo | None = None
    agent_loaded: bool = False
    perf_map_ok: bool = False
    symbols: ProcessSymbols | None = None  # eager cache, used if the process is gone at collect()
    detail: str = ""


class SymbolPreparer:
    """Perf maps and symbol caches of the sampled processes, prepared by one worker thread.

    ``alive(pid)`` says whether the sampled process (not a reused pid) still runs; ``warnings`` is the
    sampler's list of end-of-run warnings, appended to.
    """

    def __init__(
        self,
        perf_map_mode: str,
        perf_map_refresh: float,
        alive: Callable[[int], bool],
        warnings: list[str],
        on_jvm: Callable[[int], bool] | None = None,
        jit_walkable: Callable[[int], bool] = lambda _pid: False,
        scratch: Path | None = None,
    ) -> None:
        self.perf_map_mode = perf_map_mode
        self.perf_map_refresh = perf_map_refresh
        self.histories: dict[int, PerfMapHistory] = {}
        self._alive = alive
        self._warnings = warnings
        self._on_jvm = on_jvm  # a JVM entered the scope: True once its interpreter can be named
        self._jit_walkable = jit_walkable  # the walker steps the JVM's JIT frames without frame pointers
        self._keep_history = False
        # Perf-map versions until symbolization: a temporary directory, or the checkpoint journal's (kept by a kill)
        self._scratch: Path | None = scratch
        self._own_scratch = scratch is None
        self._prepared: dict[int, _Prepared] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------ worker life cycle

    def start(self, keep_history: bool) -> None:
        """Start the worker; ``keep_history`` (the ring buffer) keeps every perf-map version and refreshes them."""
        self._keep_history = keep_history
        self._worker = threading.Thread(target=self._prepare_loop, name="symbol-prep", daemon=True)
        self._worker.start()

    def prepare(self, pid: int) -> None:
        """Queue the perf-map dump and symbol-cache warm-up of a process that entered the scope."""
        with self._lock:
            if pid in self._prepared:
                return
            self._prepared[pid] = _Prepared()
        self._queue.put(pid)

    def stop(self) -> None:
        """End the worker (what it prepared stays usable)."""
        self._stopping.set()
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=60)
            self._worker = None

    def close(self) -> None:
        """Stop, free the prepared symbol caches and the kept perf-map versions. Idempotent."""
        self.stop()
        for prepared in self._prepared.values():
            if prepared.symbols is not None:
                prepared.symbols.close()
                prepared.symbols = None
        if self._scratch is not None and self._own_scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _prepare_loop(self) -> None:
        periodic = self._keep_history and self.perf_map_refresh > 0
        while True:
            try:
                pid = self._queue.get(timeout=1.0 if periodic else None)
            except queue.Empty:
                self._refresh_due()
                continue
            if pid is None or self._stopping.is_set():
                return
            try:
                self._prepare(pid)
            except Exception as exc:  # noqa: BLE001 - a process may vanish at any point; never kill the worker
                with self._lock:
                    self._prepared[pid].detail = f"prepare failed: {exc}"
            if periodic:
                self._refresh_due()

    # ------------------------------------------------------------ perf maps

    def epoch_at(self, pid: int, time_ns: int) -> int:
        """The perf-map version a sample of ``pid`` at ``time_ns`` is named with (0 without versions)."""
        history = self.histories.get(pid)
        return history.epoch_at(time_ns) if history is not None else 0

    def _refresh_due(self) -> None:
        """Re-dump the perf map of every live JVM whose last refresh is perf_map_refresh seconds old."""
        now = time.monotonic_ns()
        for pid, history in list(self.histories.items()):
            last = history.last_refresh_ns
            if self._stopping.is_set():
                return
            if last is not None and now - last < self.perf_map_refresh * 1e9:
                continue
            prepared = self._prepared.get(pid)
            if prepared is None or prepared.jvm_info is None or not self._alive(pid):
                continue
            try:
                self._refresh_perf_map(pid, prepared.jvm_info, prepared)
            except Exception as exc:  # noqa: BLE001 - the process may be gone; the next refresh or the end retries
                prepared.detail = f"refresh failed: {exc}"

    def history_versions(self) -> dict[int, list[tuple[int, str | None]]]:
        """Every process's perf-map versions so far (the checkpoint journal names them)."""
        return {pid: history.versions() for pid, history in list(self.histories.items())}

    def _history(self, pid: int) -> PerfMapHistory:
        history = self.histories.get(pid)
        if history is None:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="taskprof-perfmaps-"))
            history = self.histories[pid] = PerfMapHistory(pid, self._scratch)
        return history

    def _refresh_perf_map(self, pid: int, info: jvm.JvmInfo, prepared: _Prepared) -> perfmap.PerfMapResult:
        """Write the map; with the ring buffer, also keep this version for the samples before it."""
        if not self._keep_history:
            return self._write_perf_map(pid, info, prepared)
        history = self._history(pid)
        index = history.begin()
        result = self._write_perf_map(pid, info, prepared)
        history.finish(index, result.ok)
        return result

    def _prepare(self, pid: int) -> None:
        prepared = self._prepared[pid]
        info = jvm.jvm_info(pid)
        prepared.jvm_info = info
        jvm_known = info is not None and self._on_jvm is not None and self._on_jvm(pid)
        if info is not None and not info.preserve_frame_pointer and not (jvm_known and self._jit_walkable(pid)):
            self._warnings.append(
                f"pid {pid}: JVM without -XX:+PreserveFramePointer and its code cache not readable from vmStructs, "
                f"its Java stacks are broken (see java_unwalkable); restart it with {PFP_FIX}"
            )
        if info is not None and self._wants_perf_map(pid):
            # A JVM found at exec is not attachable for a moment: retry with backoff for ~20 s.
            delay = 0.25
            deadline = time.monotonic() + 20
            while not self._stopping.is_set() and self._alive(pid):
                result = self._refresh_perf_map(pid, info, prepared)
                prepared.detail = result.detail
                if result.ok or time.monotonic() > deadline:
                    break
                self._stopping.wait(delay)
                delay = min(delay * 2, 4.0)
        elif info is None and time.monotonic() - _process_age_base(pid) < 1.0:
            self._stopping.wait(1.0)  # just exec'd: let the loader map the libraries first
        if info is not None and not jvm_known and self._on_jvm is not None and self._alive(pid):
            self._on_jvm(pid)  # again once attachable: a JVM found at exec had no libjvm.so mapped yet
        if self._alive(pid) and not self._stopping.is_set():
            prepared.symbols = ProcessSymbols(pid, eager=True)

    def _wants_perf_map(self, pid: int) -> bool:
        """Whether to attach to the JVM for a perf map: when asked (jcmd, agent), and in auto mode only when
        the walker cannot name its JIT frames from the JVM's own code cache (vmStructs unreadable, or
        --no-hotspot-unwind): by default nothing is attached to or loaded into a running JVM."""
        if self.perf_map_mode == "auto":
            return not self._jit_walkable(pid)
        return self.perf_map_mode != "none"

    def _use_agent(self, info: jvm.JvmInfo, prepared: _Prepared) -> bool:
        """The agent for JDK 8/11 (no Compiler.perfmap), or when asked; an unknown version tries jcmd first."""
        if self.perf_map_mode == "agent" or prepared.agent_loaded:
            return True
        return self.perf_map_mode == "auto" and info.major is not None and not info.has_perfmap_command

    def _write_perf_map(self, pid: int, info: jvm.JvmInfo, prepared: _Prepared) -> perfmap.PerfMapResult:
        if self._use_agent(info, prepared):
            if prepared.agent_loaded:
                return perfmap.PerfMapResult(pid, True, "agent", "already loaded")
            result = perfmap.load_agent(pid)
            prepared.agent_loaded = result.ok
        else:
            result = perfmap.dump_perf_map(pid)
            if not result.ok and self.perf_map_mode == "auto" and "Unknown diagnostic command" in result.detail:
                # A JDK older than its release file said (or none was readable): the agent works on all.
                result = perfmap.load_agent(pid)
                prepared.agent_loaded = result.ok
        prepared.perf_map_ok = prepared.perf_map_ok or result.ok
        return result

    def window_symbols(self, pid: int) -> ProcessSymbols | None:
        """During the window: the cache prepared for ``pid`` (the worker has finished with it), or None
        while it is not ready. Only the caller's thread uses it until collection."""
        prepared = self._prepared.get(pid)
        return prepared.symbols if prepared is not None else None

    # ------------------------------------------------------------ at collection (worker stopped)

    def symbols_for(self, pid: int) -> tuple[ProcessSymbols, bool]:
        """A symbol cache for ``pid`` (fresh when alive, else the one prepared) and whether it is ours to free."""
        prepared = self._prepared.get(pid)
        alive = self._alive(pid)
        if alive:
            info = prepared.jvm_info if prepared and prepared.jvm_info else jvm.jvm_info(pid)
            if info is not None and self._wants_perf_map(pid):
                # Again right before symbolization, so code compiled during the window resolves.
                result = self._refresh_perf_map(pid, info, prepared or _Prepared(jvm_info=info))
                if not result.ok:
                    self._warnings.append(
                        f"pid {pid}: could not write its perf map ({result.method}: {result.detail[:120]}); "
                        "Java frames show as [unknown]; "
                        "check that the JVM allows attach (no -XX:+DisableAttachMechanism)"
                    )
            symbols = ProcessSymbols(pid)
            owned = True
        elif prepared is not None and prepared.symbols is not None:
            symbols, owned = prepared.symbols, False
        else:
            symbols, owned = ProcessSymbols(pid), True
        if pid not in self.histories:
            symbols.set_perf_map(perfmap.read_perf_map(pid))
        return symbols, owned

    def is_java(self, pid: int, symbols: ProcessSymbols | None) -> bool:
        prepared = self._prepared.get(pid)
        return (
            (prepared is not None and prepared.jvm_info is not None)
            or jvm.is_jvm(pid)
            or (symbols is not None and (symbols.perf_map is not None or pid in self.histories))
        )

    def release_symbols(self, pid: int) -> None:
        """Free the cache prepared for ``pid`` (its symbol tables): after the window, once a
        fresh cache has adopted its names or its stacks are named, so no two caches of a process, nor the
        caches of processes already named, are held while the next one is named."""
        prepared = self._prepared.get(pid)
        if prepared is not None and prepared.symbols is not None:
            prepared.symbols.close()
            prepared.symbols = None

    def discard_history(self, pid: int) -> None:
        """The perf-map versions of ``pid`` are no longer needed (its stacks are folded)."""
        history = self.histories.get(pid)
        if history is not None:
            history.discard()


def _process_age_base(pid: int) -> float:
    """Monotonic time the process started (so callers can tell how young it is); now when unknown."""
    ticks = start_ticks(pid)
    if ticks is None:
        return time.monotonic()
    try:
        hz = os.sysconf("SC_CLK_TCK")
        boot_to_start = ticks / hz
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        return time.monotonic() - (uptime - boot_to_start)
    except (OSError, ValueError):
        return time.monotonic()
