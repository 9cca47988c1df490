"""A killed run's capture rebuilt from its checkpoint journal (``profiler recover``).

``replay`` folds the journal's checkpoints into the state of the last one (pure); ``recovered_collected``
turns that state into what the run had collected (``write.Collected``), so the run's own writer produces
an ordinary capture, marked as recovered: window end = the last checkpoint, ``stopped_by: recovered`` and a warning
saying how much was lost. A process still alive is symbolized the normal way (bcc); a process that is
gone by its saved maps and the ELF files on disk (profiler/symbols/elfsyms.py), its Java frames by the saved
perf-map versions either way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..capture.checkpoint import PERF_MAPS_DIR, checkpoint_dir, journal_path
from ..capture.format import (
    META_FILE,
    PROFILE_COPY,
    CounterValue,
    EventCount,
    PidCounters,
    ProcessInfo,
    SamplerStats,
    is_safe_name,
)
from ..capture.journal import JournalError, JournalRead, read_journal
from ..capture.offcpucheckpoint import OffCpuCheckpoint, read_offcpu_checkpoint
from ..capture.stackstore import CollectedStacks, StackStore
from ..capture.timeline import CounterReading
from ..errors import CaptureFormatError, OutputExistsError, OutputWriteError
from ..files import safeio
from ..files.atomic import atomic_write_text
from ..symbols.elfsyms import OfflineSymbols
from ..symbols.perfmap_history import PerfMapHistory
from ..symbols.symbolize import KernelResolver, StackFolder, SymbolResolver, tabulate_store
from ..unwind.recorded import RecordedNames
from .options import RUN_OPTIONS, RunOptions
from .write import Collected, write_capture

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
    interval = float(journal.header.get("interval", RUN_OPTIONS["interval"].default))
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


# ---------------------------------------------------------------- the stacks, named


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
    """The live process's symbols (procsyms) when the very process still runs, else the saved maps and the
    ELF files; and which."""
    from ..capture.checkpoint import start_ticks

    ticks = start_ticks(pid)
    if ticks is not None and saved is not None and saved[0] == ticks:
        try:
            from ..symbols.procsyms import ProcessSymbols

            return ProcessSymbols(pid), "live"
        except ImportError:
            pass
    return OfflineSymbols(saved[1] if saved is not None else ""), "offline"


class RecoveredStacks:
    """The journal's stacks named as the sampler would have named them at the window's end."""

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
        self._kernel = kernel
        self._symbols = symbols
        self.symbolized: dict[int, str] = {}  # pid -> "live" or "offline"

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


def recovered_collected(
    replayed: Replayed,
    offcpu: OffCpuCheckpoint | None,
    stacks: RecoveredStacks,
    post_start: tuple[float, float],
) -> Collected:
    """What the killed run had collected by its last checkpoint, as the writer takes it: the window ends
    there, its stacks named now, every process's counters as last read, no events counted."""
    header = replayed.header
    end_time = replayed.time
    processes = [p if p.exited else replace(p, last_seen=end_time) for p in replayed.processes]
    exited = {p.pid for p in processes if p.exited}
    counters = {pid: c for pid, c in replayed.counters.items() if pid in exited}  # as read at exit
    warnings = [recovered_note(replayed), *replayed.warnings]
    named = stacks.collect()
    for process in processes:
        if process.pid in counters:
            continue
        if process.pid in replayed.counters:
            counters[process.pid] = replayed.counters[process.pid]
        else:
            warnings.append(f"pid {process.pid}: counters unreadable (none in the journal)")
    if not any(p.sampled for p in processes):
        warnings.append("no workload process was found: check --known-spes or add --pid")
    warnings += [*stacks.warnings, *safeio.take_warnings()]
    return Collected(
        start_time=float(header.get("start_time", end_time)),
        end_time=end_time,
        stopped_by="recovered",
        window_started=True,
        exec_watch=str(header.get("exec_watch", "polling")),
        net_mode=header.get("net"),
        stack_collection="ringbuf",
        stack_walk=stacks.stack_walk,
        max_stack_depth=stacks.max_stack_depth,
        thread_names=str(header.get("thread_names", "comm")),
        cycles_source=replayed.cycles_source,
        processes=processes,
        counters=counters,
        counter_readings=replayed.readings,
        stacks=named,
        offcpu={pid: list(rows) for pid, rows in offcpu.entries.items()} if offcpu is not None else {},
        offcpu_intervals=None,  # the copy holds the sums of the window so far, not split by interval
        events=EventCount(None, "none", "not counted: capture recovered from a checkpoint journal", method="none"),
        warnings=tuple(warnings),
        post_start=post_start,
    )


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
    declared = {name: how.default for name, how in RUN_OPTIONS.items()}  # what a header without the key ran with
    options = RunOptions(
        duration=float(header.get("duration", 0.0)),
        out=directory,
        profile=profile_path,
        known_spes=profile_path,
        frequency=int(header.get("frequency", declared["frequency"])),
        host=str(header.get("host", "localhost")),
        stack_storage_size=int(header.get("stack_storage_size", declared["stack_storage_size"])),
        interval=float(header.get("interval", declared["interval"])),
        perf_map_refresh=float(header.get("perf_map_refresh", declared["perf_map_refresh"])),
        checkpoint=0.0,
        off_cpu=offcpu is not None,
        off_cpu_min_block_ms=offcpu.min_block_ms if offcpu is not None else declared["off_cpu_min_block_ms"],
        off_cpu_sample_every=offcpu.sample_every if offcpu is not None else 1,
    )
    post_start = (time.monotonic(), time.process_time())
    stacks = RecoveredStacks(replayed, checkpoint_dir(directory), kernel, symbols)
    try:
        write_capture(options, recovered_collected(replayed, offcpu, stacks, post_start), load_profile(profile_path))
    except OSError as exc:
        raise OutputWriteError(
            f"{directory}: writing the recovered capture failed ({exc.strerror or exc}); free space there and run "
            f"`profiler recover {directory}` again (the journal is kept)"
        ) from None
    samples = sum(replayed.store.sample_counts().values())
    return RecoveryResult(directory, samples, replayed.time, replayed.checkpoints, replayed.damage, stacks.symbolized)


__all__ = ["Replayed", "RecoveryResult", "load_replayed", "recover_capture", "replay"]
