"""A killed run's capture rebuilt from its checkpoint journal (``profiler recover``).

``replay`` folds the journal's checkpoints into the state of the last one (pure). The ``Recovered*``
classes then stand in for the run's components, so the runner's own writer produces an ordinary
capture, marked as recovered: window end = the last checkpoint, ``stopped_by: recovered`` and a warning
saying how much was lost. A process still alive is symbolized the normal way (bcc); a process that is
gone by its saved maps and the ELF files on disk (profiler/symbols/elfsyms.py), its Java frames by the saved
perf-map versions either way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..capture.checkpoint import PERF_MAPS_DIR, checkpoint_dir, journal_path
from ..capture.format import (
    META_FILE,
    PROFILE_COPY,
    CounterValue,
    EventCount,
    FlinkSubtask,
    FlinkTaskManager,
    PidCounters,
    ProcessInfo,
    SamplerStats,
    VertexWindow,
    atomic_write_text,
    is_safe_name,
)
from ..capture.journal import JournalError, JournalRead, read_journal
from ..capture.offcpu import OffCpuEntry
from ..capture.offcpucheckpoint import OffCpuCheckpoint, read_offcpu_checkpoint
from ..capture.stackstore import CollectedStacks, SamplerCheckpoint, StackStore
from ..capture.timeline import CounterReading
from ..errors import CaptureFormatError, OutputExistsError, OutputWriteError
from ..symbols.elfsyms import OfflineSymbols
from ..symbols.perfmap_history import PerfMapHistory
from ..symbols.symbolize import KernelResolver, StackFolder, SymbolResolver, tabulate_store
from ..unwind.recorded import RecordedNames

KERNEL_STACK_DEPTH_MAX = 127  # as profiler/sampling/sampler.py
NO_METHODS = "not read: the profiler was killed before symbolization (recovered capture)"


@dataclass
class Replayed:
    """The run as its last whole checkpoint saw it."""

    header: Mapping[str, Any]
    store: StackStore
    checkpoints: int = 0
    time: float = 0.0  # wall clock of the last checkpoint
    processes: list[ProcessInfo] = field(default_factory=list)
    counters: dict[int, PidCounters] = field(default_factory=dict)
    readings: dict[int, list[CounterReading]] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)
    perf_maps: dict[int, list[tuple[int, str | None]]] = field(default_factory=dict)
    maps: dict[int, tuple[int | None, str]] = field(default_factory=dict)
    java_names: dict[int, RecordedNames] = field(default_factory=dict)  # per JVM, its names as saved
    warnings: list[str] = field(default_factory=list)
    cycles_source: str = "estimated"
    damage: str | None = None


def _record(cls: type, payload: Mapping[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in payload.items() if k in known})


def _counters(payload: Mapping[str, Any]) -> PidCounters:
    events = {name: _record(CounterValue, value) for name, value in payload.get("events", {}).items()}
    return _record(PidCounters, {**payload, "events": events})  # type: ignore[no-any-return]


def _is_copy_name(name: object) -> bool:
    """A perf-map copy's name as PerfMapHistory writes it (never a path: a journal names no other file)."""
    return isinstance(name, str) and re.fullmatch(r"perf-\d+-\d+\.map", name) is not None


def replay(journal: JournalRead) -> Replayed:
    """The last whole checkpoint's state, stacks and counts accumulated over all of them (pure).
    Raises ValueError when a checkpoint contradicts the ones before it."""
    interval = float(journal.header.get("interval", 10.0))
    replayed = Replayed(journal.header, StackStore(int(interval * 1e9)), damage=journal.damage)
    for checkpoint in journal.checkpoints:
        replayed.store.apply_delta(checkpoint.stacks)
        state = checkpoint.state
        replayed.checkpoints += 1
        replayed.time = checkpoint.time
        replayed.processes = [_record(ProcessInfo, p) for p in state.get("processes", [])]
        replayed.counters = {int(pid): _counters(c) for pid, c in state.get("counters", {}).items()}
        pids = [p.pid for p in replayed.processes] + [c.pid for c in replayed.counters.values()]
        if not all(type(pid) is int and pid > 0 for pid in pids):  # a pid names a directory of the capture
            raise ValueError("a process or counter record has no valid pid")
        for pid, rows in state.get("readings", {}).items():
            replayed.readings.setdefault(int(pid), []).extend(CounterReading(*row) for row in rows)
        replayed.dropped = {int(pid): int(n) for pid, n in state.get("dropped", {}).items()}
        replayed.perf_maps = {
            int(pid): [(int(start), name if _is_copy_name(name) else None) for start, name in versions]
            for pid, versions in state.get("perf_maps", {}).items()
        }
        for pid, saved in state.get("maps", {}).items():
            replayed.maps[int(pid)] = (saved.get("start_ticks"), str(saved.get("maps", "")))
        for pid, saved in state.get("java_names", {}).items():
            replayed.java_names.setdefault(int(pid), RecordedNames()).apply(saved)
        replayed.warnings = [str(w) for w in state.get("warnings", [])]
        replayed.cycles_source = str(state.get("cycles_source", replayed.cycles_source))
        if state.get("origin_ns") is not None:
            replayed.store.begin(int(state["origin_ns"]))
    return replayed


def recovered_note(replayed: Replayed) -> str:
    """The warning every recovered capture carries."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(replayed.time))
    period = replayed.header.get("checkpoint")
    bound = f" (at most --checkpoint {period:g} s)" if isinstance(period, int | float) else ""
    note = (
        f"recovered from checkpoint {replayed.checkpoints} at {at}: the profiler died before writing its capture; "
        f"samples after it are lost{bound}; lower --checkpoint to lose less"
    )
    if replayed.damage:
        note += f"; the journal's tail was unreadable and dropped ({replayed.damage})"
    return note


# ---------------------------------------------------------------- the components, replayed


class RecoveredScope:
    exec_watch_mode = "polling"

    def __init__(self, processes: Sequence[ProcessInfo]) -> None:
        self._processes = list(processes)

    def start(self) -> None:
        return None

    def poll(self) -> tuple[list[ProcessInfo], list[int]]:
        return [], []

    def processes(self) -> list[ProcessInfo]:
        return list(self._processes)

    def finish(self, end_time: float) -> list[ProcessInfo]:
        return [p if p.exited else replace(p, last_seen=end_time) for p in self._processes]

    def close(self) -> None:
        return None


class RecoveredCounters:
    exits_note = ""  # the recorded counters' notes already say how each was measured

    def stop_exits(self) -> None:
        return None

    def __init__(self, counters: Mapping[int, PidCounters]) -> None:
        self._counters = dict(counters)

    def add_pid(self, pid: int) -> None:
        return None

    def pid_exited(self, pid: int) -> None:
        return None

    def read(self, pid: int) -> PidCounters:
        return self._counters[pid]

    def close(self) -> None:
        return None


class RecoveredEvents:
    warnings: list[str] = []

    def start(self, processes: Sequence[ProcessInfo], window_start: float | None = None) -> None:
        return None

    def add_process(self, process: ProcessInfo) -> None:
        return None

    def finish(self, end_time: float) -> EventCount:
        return EventCount(None, "none", "not counted: capture recovered from a checkpoint journal", method="none")

    def vertex_windows(self) -> list[VertexWindow]:
        return []

    def flink_placement(self) -> tuple[list[FlinkSubtask], list[FlinkTaskManager]]:
        return [], []  # read from REST at a window's end, which a killed run never reached


class RecoveredOffCpu:
    """The off-CPU tracer as the last checkpoint's copy saw it: its entries, already named. No timeline:
    the copy holds the sums of the whole window so far, not split by interval."""

    warnings: list[str] = []

    def __init__(self, entries: Mapping[int, Sequence[OffCpuEntry]]) -> None:
        self._entries = {pid: list(rows) for pid, rows in entries.items()}
        self.interval_entries: dict[int, dict[int, list[OffCpuEntry]]] | None = None

    def start(self) -> str:
        return "recovered"

    def add_pid(self, pid: int) -> None:
        return None

    def stop(self) -> None:
        return None

    def pid_exited(self, pid: int) -> None:
        return None

    def tick(self, interval: int) -> None:
        return None

    def checkpoint_entries(self) -> dict[int, list[OffCpuEntry]]:
        return {}

    def collect(self) -> dict[int, list[OffCpuEntry]]:
        return {pid: list(rows) for pid, rows in self._entries.items()}

    def close(self) -> None:
        return None


def load_offcpu(directory: Path) -> OffCpuCheckpoint | None:
    """The off-CPU copy beside the journal; None when the run had no --off-cpu; CaptureFormatError when
    it is damaged (the on-CPU part could still be recovered: the message says how)."""
    try:
        return read_offcpu_checkpoint(checkpoint_dir(directory))
    except ValueError as exc:
        raise CaptureFormatError(
            f"{exc}; move it aside to recover the on-CPU part without the off-CPU time"
        ) from None
    except OSError as exc:
        where = checkpoint_dir(directory)
        raise CaptureFormatError(f"{where}: off-CPU copy unreadable ({exc.strerror or exc})") from None


SymbolsFor = Callable[[int, tuple[int | None, str] | None], tuple[SymbolResolver, str]]


def symbols_for(pid: int, saved: tuple[int | None, str] | None) -> tuple[SymbolResolver, str]:
    """bcc's cache when the very process still runs, else the saved maps and the ELF files; and which."""
    from ..capture.checkpoint import start_ticks

    ticks = start_ticks(pid)
    if ticks is not None and saved is not None and saved[0] == ticks:
        try:
            from ..symbols.symbolize import ProcessSymbols

            return ProcessSymbols(pid), "live"
        except ImportError:
            pass
    return OfflineSymbols(saved[1] if saved is not None else ""), "offline"


class RecoveredSampler:
    """The sampler as the journal saw it: collect() folds the replayed stacks."""

    collection = "ringbuf"

    def __init__(
        self,
        replayed: Replayed,
        directory: Path,
        kernel: Callable[[], KernelResolver],
        symbols: SymbolsFor = symbols_for,
    ) -> None:
        header = replayed.header
        self.replayed = replayed
        self.directory = directory
        self.stack_walk = str(header.get("stack_walk", "kernel"))
        self.max_stack_depth = int(header.get("max_stack_depth", 127))
        self.warnings: list[str] = []
        self.thread_names = str(header.get("thread_names", "comm"))
        self._kernel = kernel
        self._symbols = symbols
        self.symbolized: dict[int, str] = {}  # pid -> "live" or "offline"

    def start(self) -> None:
        return None

    def begin_window(self) -> None:
        return None

    def add_pid(self, pid: int) -> None:
        return None

    def prepare_symbols(self, pid: int) -> None:
        return None

    def prepare_unwinding(self, pids: Sequence[int]) -> None:
        return None

    def pid_exited(self, pid: int) -> None:
        return None

    def sample_count(self, pid: int) -> int:
        return self.replayed.store.sample_counts().get(pid, 0)

    def stop(self) -> None:
        return None

    def checkpoint(self) -> SamplerCheckpoint | None:
        return None

    def name_batch(self) -> int:
        return 0  # the window is over: the replay names everything in collect()

    def close(self) -> None:
        return None

    def _refreshed(self, pid: int, history: PerfMapHistory | None) -> PerfMapHistory | None:
        """A JVM still running: its perf map dumped once more now, as a normal end does, so code compiled
        after the last saved version is named too (the new version comes after every sample)."""
        from ..scope import jvm
        from ..symbols import perfmap

        history = history or PerfMapHistory(pid, self.directory / PERF_MAPS_DIR)
        try:
            info = jvm.jvm_info(pid)
            ok = info is not None and (not info.has_perfmap_command or perfmap.dump_perf_map(pid).ok)
            history.finish(history.begin(), ok)  # with the agent (JDK 8/11) the map is current already
        except Exception as exc:  # noqa: BLE001 - the saved versions still name what they can
            self.warnings.append(f"pid {pid}: its perf map could not be dumped again ({exc}); saved versions used")
        return history if history.snapshots else None

    def collect(self) -> dict[int, CollectedStacks]:
        store, replayed = self.replayed.store, self.replayed
        java = {p.pid for p in replayed.processes if p.jvm_version is not None} | set(replayed.perf_maps)
        counts = store.sample_counts()
        kernel = self._kernel()
        result = {}
        for pid in store.pids():
            symbols, how = self._symbols(pid, replayed.maps.get(pid))
            self.symbolized[pid] = how
            try:
                folder = StackFolder(
                    symbols,
                    kernel,
                    self.max_stack_depth,
                    pid in java,
                    min(self.max_stack_depth, KERNEL_STACK_DEPTH_MAX),
                    walker=self.stack_walk == "bpf",
                    methods=replayed.java_names.get(pid),
                    no_methods_cause=NO_METHODS,
                )
                versions = replayed.perf_maps.get(pid)
                history = PerfMapHistory.restore(pid, self.directory / PERF_MAPS_DIR, versions) if versions else None
                if how == "live" and pid in java:
                    history = self._refreshed(pid, history)
                table = tabulate_store(store, pid, folder, history, None)
            finally:
                symbols.close()
            dropped = replayed.dropped.get(pid, 0)
            stats = SamplerStats(
                pid=pid, samples=counts.get(pid, 0) + dropped, max_stack_depth=self.max_stack_depth, dropped=dropped
            )
            stats = replace(stats, **folder.stats_fields)  # type: ignore[arg-type]
            if history is not None:
                stats = replace(stats, perf_map_snapshots=history.snapshots)
            result[pid] = CollectedStacks(table, stats)
        return result


# ---------------------------------------------------------------- the recovery


@dataclass(frozen=True)
class RecoveryResult:
    out: Path
    samples: int  # samples in the recovered stacks
    end_time: float  # the last checkpoint: the recovered window's end
    checkpoints: int
    damage: str | None  # the journal's dropped tail, if any
    symbolized: Mapping[int, str]  # pid -> "live" (bcc) or "offline" (saved maps, ELF files)


def default_kernel() -> KernelResolver:
    from ..symbols.symbolize import KernelSymbols

    return KernelSymbols()


def load_replayed(directory: Path) -> Replayed:
    """The journal of ``directory`` replayed; one-line CaptureFormatError naming the file when unusable."""
    path = journal_path(directory)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CaptureFormatError(
            f"{path}: no checkpoint journal; the run had --checkpoint 0, or used --stack-collection stackmap, or "
            "ended normally (then the directory holds its capture): nothing to recover"
        ) from None
    except OSError as exc:
        raise CaptureFormatError(f"{path}: unreadable ({exc.strerror or exc}); check its permissions (root?)") from None
    try:
        replayed = replay(read_journal(data))
    except JournalError as exc:
        raise CaptureFormatError(f"{path}: {exc}; this journal cannot be recovered: re-run the capture") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CaptureFormatError(
            f"{path}: a checkpoint contradicts the ones before it ({exc}); re-run the capture"
        ) from None
    host = replayed.header.get("host", "localhost")
    if not is_safe_name(host):
        raise CaptureFormatError(f"{path}: host {host!r} is not a safe directory name; this journal cannot be used")
    if not replayed.checkpoints:
        why = f" ({replayed.damage})" if replayed.damage else ""
        raise CaptureFormatError(
            f"{path}: no whole checkpoint{why}: the profiler died within its first --checkpoint period; nothing to "
            "recover; a shorter --checkpoint keeps more of a killed run"
        )
    return replayed


def recover_capture(
    directory: Path,
    kernel: Callable[[], KernelResolver] = default_kernel,
    symbols: SymbolsFor = symbols_for,
) -> RecoveryResult:
    """Write the capture of a killed run into ``directory`` (its ``--out``) from its checkpoint journal."""
    from ..matching.appprofile import load_profile
    from .runner import Components, Runner, RunOptions

    directory = Path(directory)
    if (directory / META_FILE).exists():
        raise OutputExistsError(f"{directory}: already holds a capture ({META_FILE}); nothing to recover")
    replayed = load_replayed(directory)
    offcpu = load_offcpu(directory)
    header = replayed.header
    profile_path = checkpoint_dir(directory) / PROFILE_COPY
    try:
        atomic_write_text(profile_path, str(header.get("profile_text", "")))
    except OSError as exc:
        raise OutputWriteError(f"{profile_path}: cannot be written ({exc.strerror or exc}); free space there") from None
    options = RunOptions(
        duration=float(header.get("duration", 0.0)),
        out=directory,
        profile=profile_path,
        known_spes=profile_path,
        frequency=int(header.get("frequency", 99)),
        host=str(header.get("host", "localhost")),
        stack_storage_size=int(header.get("stack_storage_size", 65536)),
        interval=float(header.get("interval", 10.0)),
        perf_map_refresh=float(header.get("perf_map_refresh", 60.0)),
        checkpoint=0.0,
        off_cpu=offcpu is not None,
        off_cpu_min_block_ms=offcpu.min_block_ms if offcpu is not None else 1.0,
        off_cpu_sample_every=offcpu.sample_every if offcpu is not None else 1,
    )
    sampler = RecoveredSampler(replayed, checkpoint_dir(directory), kernel, symbols)
    exited = {p.pid for p in replayed.processes if p.exited}
    components = Components(
        scope=RecoveredScope(replayed.processes),
        sampler=sampler,
        counters=RecoveredCounters(replayed.counters),
        net=None,
        events=RecoveredEvents(),
        cycles_source=lambda: replayed.cycles_source,
        offcpu=RecoveredOffCpu(offcpu.entries) if offcpu is not None else None,
    )
    runner = Runner(options, components)
    state = runner.state
    state.start_time = float(header.get("start_time", replayed.time))
    state.end_time = replayed.time
    state.stopped_by = "recovered"
    state.window_started = True
    state.exec_watch = str(header.get("exec_watch", "polling"))
    state.net_mode = header.get("net")
    state.counters = {pid: c for pid, c in replayed.counters.items() if pid in exited}
    state.counter_readings = replayed.readings
    state.warnings = [recovered_note(replayed), *replayed.warnings]
    try:
        runner.write_capture(components, load_profile(profile_path))
    except OSError as exc:
        raise OutputWriteError(
            f"{directory}: writing the recovered capture failed ({exc.strerror or exc}); free space there and run "
            f"`profiler recover {directory}` again (the journal is kept)"
        ) from None
    samples = sum(replayed.store.sample_counts().values())
    return RecoveryResult(directory, samples, replayed.time, replayed.checkpoints, replayed.damage, sampler.symbolized)


__all__ = ["Replayed", "RecoveryResult", "load_replayed", "recover_capture", "replay"]
