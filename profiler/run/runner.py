"""One host's profiling run: scope, counters, stacks and network over a window, then the capture.

The order matters for overhead and accuracy: every BPF program is compiled and attached before the
window starts (LLVM costs seconds of CPU), the window only adds PIDs to in-kernel filters, and all
symbolization and writing happen after it ends. Whatever happens (duration reached, SIGINT/SIGTERM,
an exception), everything collected so far is written.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from .. import __version__
from ..bpf.compiler import release_compiler_pages, release_freed_memory
from ..bpf.stats import bpf_prog_run_stats, window_stats
from ..capture import format as capture
from ..capture.checkpoint import DEFAULT_CHECKPOINT, PERF_MAPS_DIR, CheckpointWriter, checkpoint_dir
from ..capture.format import (
    DEFAULT_INTERVAL,
    EventCount,
    FlinkSubtask,
    FlinkTaskManager,
    NetStats,
    Overhead,
    OverheadPoint,
    PidCounters,
    ProcessInfo,
    RunMeta,
    VertexWindow,
)
from ..capture.offcpu import DEFAULT_SAMPLE_EVERY, OffCpuEntry
from ..capture.offcpucheckpoint import OffCpuCheckpoint, write_offcpu_checkpoint
from ..capture.stackstore import CollectedStacks, SamplerCheckpoint
from ..capture.stacktable import write_table
from ..capture.timeline import CounterReading, counter_deltas, rss_bytes
from ..engines.flinkmetrics import taskmanager_pids
from ..errors import OutputWriteError, PrivilegeError
from ..files import safeio
from ..files.outputs import check_output_dir, mark_output_dir
from ..files.textinput import TEXT_ENCODING
from ..matching.aggregate import aggregate_host
from ..matching.appprofile import ApplicationProfile
from ..matching.matcher import Matcher, MatchResult, match_offcpu, match_table, unmatched_folded_lines
from ..scope.spes import DEFAULT_ROLES

if TYPE_CHECKING:
    from ..sampling.sampler import StackSampler

CAP_PERFMON = 38
CAP_BPF = 39
# Scope polling is most of the profiler's CPU while sampling (a /proc scan, exit checks, the exec
# watcher's queue): twice a second still lets a new process enter within a second.
POLL_INTERVAL = 0.5
STATUS_INTERVAL = 1.0


@dataclass(frozen=True)
class RunOptions:
    duration: float
    out: Path
    profile: Path
    known_spes: Path
    pids: tuple[int, ...] = ()
    roles: tuple[str, ...] = DEFAULT_ROLES  # the known_spes.txt roles in scope (--roles)
    frequency: int = 99
    net: bool = False
    events: int | None = None
    host: str = field(default_factory=socket.gethostname)
    start_at: float | None = None
    status_file: Path | None = None
    force: bool = False
    max_stack_depth: int | None = None  # None: 1024 with our walker, 127 with bpf_get_stack
    stack_storage_size: int = 65536
    exec_watch: bool = True
    interval: float = DEFAULT_INTERVAL
    perf_map_refresh: float = 60.0
    stack_collection: str = "auto"
    stack_walk: str = "auto"
    checkpoint: float = DEFAULT_CHECKPOINT  # seconds between checkpoint-journal records; 0: none
    # JIT frames stepped by their CodeBlob without frame pointers (issue 30); the checkpoint journal keeps
    # the names learned (profiler/unwind/recorded.py), so a recovered capture names them too.
    hotspot_unwind: bool = True
    # Blocked time per stack and cause from sched_switch (issue 31); blocks shorter than the minimum are
    # counted (meta.json) but not summed.
    off_cpu: bool = False
    off_cpu_min_block_ms: float = 1.0
    off_cpu_sample_every: int = DEFAULT_SAMPLE_EVERY  # beyond 100/s per thread one switch-out in N, counted N times
    counters: str = "auto"  # software counters from perf events or /proc (--counters, sampling/counters.py)


# ------------------------------------------------------------------ component interfaces
# The real implementations live in scope.py, sampler.py, counters.py, net.py and events.py; the
# unit tests drive the runner with fakes of these protocols.


class ScopeLike(Protocol):
    exec_watch_mode: str  # "tracepoint" or "polling", known after start()

    def start(self) -> None: ...
    def poll(self) -> tuple[list[ProcessInfo], list[int]]: ...
    def processes(self) -> list[ProcessInfo]: ...
    def finish(self, end_time: float) -> list[ProcessInfo]: ...
    def close(self) -> None: ...


class SamplerLike(Protocol):
    collection: str  # "ringbuf" or "stackmap", known after start()
    stack_walk: str  # "bpf" (our walker) or "kernel" (bpf_get_stack), known after start()
    max_stack_depth: int  # the depth the kernel allowed, known after start()
    warnings: list[str]  # end-of-run warnings, each naming the option to change

    @property
    def thread_names(self) -> str: ...  # "uprobe", "jcmd" or "comm": where the stacks' thread names came from

    def start(self) -> None: ...
    def begin_window(self) -> None: ...
    def add_pid(self, pid: int) -> None: ...
    def prepare_symbols(self, pid: int) -> None: ...
    def prepare_unwinding(self, pids: Sequence[int]) -> None: ...
    def pid_exited(self, pid: int) -> None: ...
    def sample_count(self, pid: int) -> int: ...
    def stop(self) -> None: ...
    def collect(self) -> dict[int, CollectedStacks]: ...
    def checkpoint(self) -> SamplerCheckpoint | None: ...  # what changed since the last call; None: unsupported
    def name_batch(self) -> int: ...  # native frames of the stacks new since the last call named now
    def close(self) -> None: ...


class CountersLike(Protocol):
    @property
    def exits_note(self) -> str: ...  # why exits of /proc-counted pids are not followed ("" when they are)
    def add_pid(self, pid: int) -> None: ...
    def pid_exited(self, pid: int) -> None: ...
    def read(self, pid: int) -> PidCounters: ...
    def stop_exits(self) -> None: ...  # the window is over: stop following exits (taskstats)
    def close(self) -> None: ...


class NetLike(Protocol):
    @property
    def warnings(self) -> list[str]: ...  # end-of-run warnings, complete after collect()

    def start(self) -> str: ...
    def add_pid(self, pid: int) -> None: ...
    def stop(self) -> None: ...
    def collect(self) -> dict[int, NetStats]: ...
    def close(self) -> None: ...


class OffCpuLike(Protocol):
    @property
    def warnings(self) -> list[str]: ...  # end-of-run warnings, complete after collect()

    def start(self) -> str: ...
    def add_pid(self, pid: int) -> None: ...
    def stop(self) -> None: ...
    def pid_exited(self, pid: int) -> None: ...  # a later process with its pid is not traced
    def collect(self) -> dict[int, list[OffCpuEntry]]: ...  # names the stacks: after the sampler's collect()
    def close(self) -> None: ...
    def tick(self, interval: int) -> None: ...  # an interval of the window ends (the per-interval split)
    # the sums so far, named, while attached (the checkpoint's off-CPU copy)
    def checkpoint_entries(self) -> dict[int, list[OffCpuEntry]]: ...

    # after collect(): interval -> PID -> entries, for the intervals tick() saw
    # None: the time is not split by interval (a recovered run): no offcpu_timeline.folded is written
    @property
    def interval_entries(self) -> dict[int, dict[int, list[OffCpuEntry]]] | None: ...


class SparkPlansLike(Protocol):
    def start(self, processes: Sequence[ProcessInfo]) -> None: ...
    def add_process(self, process: ProcessInfo) -> None: ...
    def finish(self) -> dict[str, Any] | None: ...


class EventsLike(Protocol):
    warnings: list[str]

    def start(self, processes: Sequence[ProcessInfo], window_start: float | None = None) -> None: ...
    def add_process(self, process: ProcessInfo) -> None: ...
    def finish(self, end_time: float) -> EventCount: ...
    def vertex_windows(self) -> list[VertexWindow]: ...
    def flink_placement(self) -> tuple[list[FlinkSubtask], list[FlinkTaskManager]]: ...


@dataclass
class Components:
    scope: ScopeLike
    sampler: SamplerLike
    counters: CountersLike
    net: NetLike | None
    events: EventsLike
    cycles_source: Callable[[], str] = lambda: "estimated"
    prog_ids: Callable[[], list[int]] = lambda: []
    spark_plans: SparkPlansLike | None = None  # stages, jobs and codegen operators of Spark drivers
    offcpu: OffCpuLike | None = None  # --off-cpu


def make_sampler(options: RunOptions) -> StackSampler:
    """The stack sampler a run uses (and `profiler run --print-bpf` prints the programs of); imports bcc."""
    from ..sampling.sampler import StackSampler

    return StackSampler(
        options.frequency,
        options.max_stack_depth,
        options.stack_storage_size,
        collection=options.stack_collection,
        interval=options.interval,
        perf_map_refresh=options.perf_map_refresh,
        stack_walk=options.stack_walk,
        hotspot_unwind=options.hotspot_unwind,
        checkpoints=options.checkpoint > 0,
        perf_map_dir=checkpoint_dir(options.out) / PERF_MAPS_DIR if options.checkpoint > 0 else None,
    )


def real_components(options: RunOptions) -> Components:
    """Build the real bcc/perf-backed components (imports bcc only here)."""
    from ..engines.events import EventCounter
    from ..engines.sparkplan import SparkPlanCollector
    from ..sampling.counters import CounterGroup
    from ..scope.analyzer import ScopeAnalyzer
    from ..scope.spes import load_known_spes

    kinds = load_known_spes(options.known_spes)
    sampler = make_sampler(options)
    net = None
    if options.net:
        from ..sampling.net import NetTracer

        net = NetTracer()
    offcpu = None
    if options.off_cpu:
        from ..sampling.offcpu import OffCpuTracer

        offcpu = OffCpuTracer(
            options.off_cpu_min_block_ms, sample_every=options.off_cpu_sample_every, borrow_namer=sampler.jvm_namer,
            thread_label=sampler.thread_label,
        )
    counters = CounterGroup(source=options.counters)

    def cycles_source() -> str:
        return str(counters.cycles_source)

    scope = ScopeAnalyzer(kinds, manual_pids=options.pids, exec_watch=options.exec_watch, roles=options.roles)

    def prog_ids() -> list[int]:
        ids = sampler.prog_ids + scope.prog_ids
        if net is not None:
            ids += net.prog_ids
        if offcpu is not None:
            ids += offcpu.prog_ids
        return ids

    return Components(
        scope=scope,
        sampler=sampler,
        counters=counters,
        net=net,
        events=EventCounter(manual_count=options.events),
        cycles_source=cycles_source,
        prog_ids=prog_ids,
        spark_plans=SparkPlanCollector(),
        offcpu=offcpu,
    )


# ------------------------------------------------------------------ checks before any work


def effective_capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges() -> None:
    if os.geteuid() == 0:
        return
    caps = effective_capabilities()
    missing = [name for bit, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")) if not caps >> bit & 1]
    if missing:
        raise PrivilegeError(
            f"missing {' and '.join(missing)}: run as root (sudo profiler run ...) "
            "or grant them (setcap cap_bpf,cap_perfmon+ep on the interpreter)"
        )


def prepare_output(out: Path, force: bool) -> None:
    """A capture directory replaces only a capture (``force``), never a directory of the user's."""
    check_output_dir(out, "--out", force=force, own_kind=(capture.META_FILE, "checkpoint"))
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    # Captures hold other users' code and thread names: the run directory is root's (or the invoking
    # user's) alone; the files in it are 0600 already (capture.atomic_write_bytes, the journal).
    # fchmod on a descriptor opened without following a link: the mode lands on the directory just
    # made, whatever the path's last component has become since.
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    mark_output_dir(out, "profiler run")


# ------------------------------------------------------------------ status file


class StatusWriter:
    """The status file the coordinator polls (JSON, rewritten atomically)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.state = "starting"
        self.started = time.time()
        self.window_start: float | None = None
        self.duration = 0.0
        self.error: str | None = None
        self.processes = 0
        self.count_samples: Callable[[], int | None] = lambda: None
        self._last = 0.0

    def update(self, state: str | None = None, force: bool = False, error: str | None = None) -> None:
        if state is not None:
            self.state = state
        if error is not None:
            self.error = error
        now = time.time()
        if self.path is None or (not force and state is None and now - self._last < STATUS_INTERVAL):
            return
        self._last = now
        elapsed = now - self.window_start if self.window_start else 0.0
        payload = {
            "state": self.state,
            "pid": os.getpid(),
            "elapsed": round(elapsed, 3),
            "remaining": round(max(0.0, self.duration - elapsed), 3) if self.window_start else self.duration,
            "processes": self.processes,
            "samples": self.samples(),
            "error": self.error,
            "time": now,
        }
        self._write(self.path, json.dumps(payload) + "\n")

    @staticmethod
    def _write(path: Path, text: str) -> None:
        """Best effort: a status that cannot be written must never end the run. On a full disk the new
        copy has no room, but the old file's page does: overwrite it in place (a reader may catch it
        half-written and polls again), so "failed: no space left" still reaches the coordinator."""
        try:
            # 0644: a coordinator logged in as a non-root user (sudo) reads it over SFTP
            capture.atomic_write_text(path, text, mode=0o644)
            return
        except OSError:
            pass
        try:
            with open(path, "r+", encoding="utf-8") as handle:
                handle.write(text)
                handle.truncate()
        except OSError:
            pass

    def samples(self) -> int | None:
        """Samples so far (None when the sampler cannot say); never raises."""
        try:
            return self.count_samples()
        except Exception:  # noqa: BLE001 - progress is best effort
            return None


# ------------------------------------------------------------------ the run


@dataclass
class WindowState:
    """What the window loop accumulated; kept in one place so a failure still writes it."""

    start_time: float = 0.0
    end_time: float = 0.0
    stopped_by: str = "duration"
    warnings: list[str] = field(default_factory=list)
    exec_watch: str = "polling"
    net_mode: str | None = None
    bpf_totals: tuple[int, int] | None = None  # run_time_ns, run_cnt of our programs, estimated for the window
    bpf_stats_seconds: float | None = None  # the seconds of the window the statistics measured
    cpu_before: float = 0.0
    cpu_after: float = 0.0
    counters: dict[int, PidCounters] = field(default_factory=dict)
    counter_readings: dict[int, list[CounterReading]] = field(default_factory=dict)
    overhead_points: list[OverheadPoint] = field(default_factory=list)
    rss_baseline: int | None = None
    window_started: bool = False
    name_batches: int = 0  # each interval: native frames named during the window
    name_batch_stacks: int = 0
    name_batch_cpu: float = 0.0
    name_batch_failed: bool = False
    meta: RunMeta | None = None


def _listening_ports(processes: Sequence[ProcessInfo]) -> dict[int, set[int]]:
    """Workload PID → the TCP ports it listens on (psutil; a process gone or not readable has none)."""
    found: dict[int, set[int]] = {}
    for process in processes:
        if process.role != "workload":
            continue
        try:
            connections = psutil.Process(process.pid).net_connections("tcp")
        except psutil.Error:
            continue
        found[process.pid] = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
    return found


@dataclass
class Collected:
    """What the components held at the end of the window, read once before anything is written."""

    processes: list[ProcessInfo]
    counters: dict[int, PidCounters]
    stacks: dict[int, CollectedStacks] = field(default_factory=dict)
    net: dict[int, NetStats] = field(default_factory=dict)
    offcpu: dict[int, list[OffCpuEntry]] = field(default_factory=dict)
    offcpu_intervals: dict[int, dict[int, list[OffCpuEntry]]] | None = field(default_factory=dict)  # interval -> PID
    events: EventCount | None = None
    spark_plans: dict[str, Any] | None = None
    flink_vertices: list[VertexWindow] = field(default_factory=list)
    flink_subtasks: list[FlinkSubtask] = field(default_factory=list)
    flink_taskmanagers: list[FlinkTaskManager] = field(default_factory=list)


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def last_interval_of(elapsed: float, interval: float) -> int:
    """Index of the interval that holds the moment ``elapsed`` seconds into the window (its end belongs to it)."""
    return max(0, math.ceil(elapsed / interval) - 1)


def _write_failure(out: Path, exc: OSError) -> OutputWriteError:
    try:
        free = f"{shutil.disk_usage(out).free // 1024} KiB free there"
    except OSError:
        free = "free space unknown"
    return OutputWriteError(
        f"{out}: writing the capture failed: {exc.strerror or exc} ({free}); the samples of this window are "
        "lost; free space in that filesystem (the coordinator writes into TMPDIR of the SSH session) and re-run"
    )


def _own_rss() -> int:
    try:
        return rss_bytes(Path("/proc/self/status").read_text())
    except OSError:
        return 0


class Runner:
    """Runs one capture. ``components`` is injectable so the loop is unit-testable with fakes."""

    def __init__(
        self,
        options: RunOptions,
        components: Components | None = None,
        clock: Callable[[], float] = time.time,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.options = options
        self._components = components
        self.clock = clock
        self.stop_event = stop_event or threading.Event()
        self.status = StatusWriter(options.status_file)
        self.status.duration = options.duration
        self.state = WindowState()
        self.journal: CheckpointWriter | None = None  # the checkpoint journal, open during the window

    # signal handling is the command's business; the runner only watches the event
    def request_stop(self) -> None:
        self.stop_event.set()

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a stop was requested."""
        if seconds > 0:
            self.stop_event.wait(seconds)
        return self.stop_event.is_set()

    def run(self, profile: ApplicationProfile) -> Path:
        """Sample over the window and write the capture; ``profile`` is the loaded application profile."""
        options = self.options
        out = options.out
        self.status.update("starting", force=True)
        safeio.take_warnings()  # another run's in this process are not this one's
        components = self._components or real_components(options)
        state = self.state
        failure: BaseException | None = None
        try:
            self._window(components)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the partial capture is written
            failure = exc
            state.stopped_by = "error" if not isinstance(exc, KeyboardInterrupt) else "signal"
            stoppers = (
                components.sampler.stop,
                components.net.stop if components.net is not None else None,
                components.offcpu.stop if components.offcpu is not None else None,
            )
            for stopper in stoppers:
                try:
                    if stopper is not None:
                        stopper()
                except Exception:  # noqa: BLE001 - the original failure is what matters
                    pass
            state.warnings.append(f"run ended early: {exc.__class__.__name__}: {exc}")
        finally:
            try:
                self._write_capture(components, profile)
                self._drop_journal()  # the capture is whole: the journal is not needed
            except OSError as exc:  # a full disk: one line with the fix instead of a traceback
                failure = failure or _write_failure(out, exc)
            finally:
                self._close(components)
                self._add_late_warnings(components)
        if failure is not None:
            self.status.update("failed", force=True, error=str(failure))
            raise failure
        self.status.update("done", force=True)
        return out

    def _window(self, components: Components) -> None:
        options, state = self.options, self.state
        components.sampler.start()
        if components.net is not None:
            state.net_mode = components.net.start()
        if components.offcpu is not None:
            components.offcpu.start()
        components.scope.start()
        state.exec_watch = components.scope.exec_watch_mode
        # Unwind tables before the window: libjvm.so's takes about a second of CPU to build (once).
        components.sampler.prepare_unwinding([p.pid for p in components.scope.processes() if p.sampled])
        release_freed_memory()  # the unwind tables' parse, like every BPF compile before it
        release_compiler_pages()  # every program is compiled: LLVM's ~85 MB of code is not needed again
        if options.start_at is not None:
            self.status.update("waiting", force=True)
            if self._wait(options.start_at - self.clock()):
                state.stopped_by = "signal"
                state.start_time = state.end_time = self.clock()
                return
        with window_stats(lambda: bpf_prog_run_stats(components.prog_ids()), self.clock()) as bpf_stats:
            state.cpu_before = _own_cpu_seconds()
            state.rss_baseline = _own_rss()
            state.start_time = self.clock()
            components.sampler.begin_window()
            state.window_started = True
            self.status.window_start = state.start_time
            initial = components.scope.processes()
            # Events first: entering the processes can take seconds (perf maps, symbol caches), and
            # Flink's first reading should come at the window's start.
            self._guarded("event counting could not start", components.events.start, initial, state.start_time)
            self._begin_journal(components)
            for process in initial:
                self._enter(components, process)
            if components.spark_plans is not None:
                self._guarded("Spark plans could not be read", components.spark_plans.start, initial)
            self.status.processes = len(initial)
            sampled = [p.pid for p in initial if p.sampled]
            sample_count = components.sampler.sample_count
            self.status.count_samples = lambda: sum(sample_count(pid) for pid in list(sampled))
            self.status.update("sampling", force=True)
            deadline = state.start_time + options.duration
            next_tick = 1
            next_checkpoint = state.start_time + options.checkpoint
            while True:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                if self._wait(min(POLL_INTERVAL, remaining)):
                    state.stopped_by = "signal"
                    break
                if bpf_stats is not None:
                    bpf_stats.tick(self.clock())
                if self.clock() >= state.start_time + next_tick * options.interval:
                    self._tick(components, next_tick - 1)
                    next_tick += 1
                if self.journal is not None and self.clock() >= next_checkpoint:
                    self._checkpoint(components)
                    next_checkpoint += options.checkpoint
                new, exited = components.scope.poll()
                for process in new:
                    self._enter(components, process)
                    self._guarded("event counting", components.events.add_process, process)
                    if components.spark_plans is not None:
                        self._guarded("Spark plans", components.spark_plans.add_process, process)
                    if process.sampled:
                        sampled.append(process.pid)
                for pid in exited:
                    self._exit(components, pid)
                self.status.processes += len(new)
                self.status.update()
            state.end_time = self.clock()
            last_interval = self._last_interval()
            if last_interval >= next_tick - 1:
                self._tick(components, last_interval)
            final_samples = self.status.samples()  # read before the maps are freed at close
            self.status.count_samples = lambda: final_samples
            components.sampler.stop()
            if components.net is not None:
                components.net.stop()
            if components.offcpu is not None:
                components.offcpu.stop()
            estimate = bpf_stats.finish(self.clock()) if bpf_stats is not None else None
            if estimate is not None and bpf_stats is not None:
                state.bpf_totals = estimate[0]
                # the seconds measured, when the figures are scaled from slices (None: on all window)
                state.bpf_stats_seconds = round(estimate[1], 3) if bpf_stats.sliced else None
            state.cpu_after = _own_cpu_seconds()

    def _last_interval(self) -> int:
        """The window's last timeline interval. The loop ends a hair after the deadline: that sliver
        (the window is never longer than --duration) belongs to the last whole interval."""
        state, options = self.state, self.options
        return last_interval_of(min(state.end_time - state.start_time, options.duration), options.interval)

    def _tick(self, components: Components, interval: int) -> None:
        """An interval of the timeline closes: counters of every live process, and our own footprint."""
        state = self.state
        for process in components.scope.processes():
            if process.pid in state.counters:  # exited: its final reading is taken at exit
                continue
            try:
                reading = CounterReading.of(interval, components.counters.read(process.pid))
            except Exception:  # noqa: BLE001 - a process that just exited has its exit reading
                continue
            state.counter_readings.setdefault(process.pid, []).append(reading)
        if components.offcpu is not None:
            self._guarded("off-CPU interval sums", components.offcpu.tick, interval)
        self._name_batch(components)
        state.overhead_points.append(
            OverheadPoint(
                t=round(self.clock() - state.start_time, 3),
                rss_bytes=_own_rss(),
                cpu_seconds=round(_own_cpu_seconds() - state.cpu_before, 4),
            )
        )

    def _name_batch(self, components: Components) -> None:
        """Native frames named while the processes run (a failure leaves them to the pass after the window)."""
        state = self.state
        cpu = _own_cpu_seconds()
        try:
            state.name_batch_stacks += components.sampler.name_batch()
        except Exception as exc:  # noqa: BLE001 - an optimisation: the post-run pass names what it missed
            if not state.name_batch_failed:
                state.warnings.append(f"native frames not named during the window ({exc.__class__.__name__}: {exc})")
            state.name_batch_failed = True
        state.name_batches += 1
        release_freed_memory()  # bcc's lookups: their freed heap would stay resident under the live stacks
        state.name_batch_cpu += _own_cpu_seconds() - cpu

    # ------------------------------------------------------------------ the checkpoint journal

    def _begin_journal(self, components: Components) -> None:
        """Open the journal with the run's header (the window has begun: the sampler's facts are known)."""
        options, state = self.options, self.state
        if options.checkpoint <= 0 or components.sampler.collection != "ringbuf":
            return
        journal = CheckpointWriter(checkpoint_dir(options.out))
        try:
            journal.begin(self._journal_header(components))
        except OSError as exc:
            state.warnings.append(f"checkpoint journal not started ({exc}); a killed run would lose its samples")
            journal.close()
            return
        self.journal = journal

    def _journal_header(self, components: Components) -> dict[str, Any]:
        """What `profiler recover` needs besides the checkpoints: the run's options and the sampler's facts."""
        options, state = self.options, self.state
        return {
            "host": options.host,
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "profiler_version": __version__,
            "frequency": options.frequency,
            "duration": options.duration,
            "interval": options.interval,
            "perf_map_refresh": options.perf_map_refresh,
            "checkpoint": options.checkpoint,
            "stack_storage_size": options.stack_storage_size,
            "profile_name": Path(options.profile).name,
            "profile_text": Path(options.profile).read_text(encoding=TEXT_ENCODING),
            "start_time": state.start_time,
            "max_stack_depth": components.sampler.max_stack_depth,
            "stack_collection": components.sampler.collection,
            "stack_walk": components.sampler.stack_walk,
            "thread_names": components.sampler.thread_names,
            "exec_watch": state.exec_watch,
            "net": state.net_mode,
        }

    def _checkpoint(self, components: Components) -> None:
        """Append a checkpoint; a failure (disk full) ends the journal with a warning, never the run."""
        state, journal = self.state, self.journal
        assert journal is not None
        try:
            taken = components.sampler.checkpoint()
            if taken is None:
                raise RuntimeError("the sampler has no checkpoints to give")
            processes = components.scope.processes()
            counters = dict(state.counters)  # exited processes: their reading at exit
            for process in processes:
                if process.pid not in counters:
                    try:
                        counters[process.pid] = components.counters.read(process.pid)
                    except Exception:  # noqa: BLE001 - it just exited; its exit reading comes later
                        continue
            exited = [replace(p, exited=True) if p.pid in state.counters else p for p in processes]
            warnings = [*state.warnings, *components.sampler.warnings]
            journal.write(taken, exited, counters, state.counter_readings, warnings, components.cycles_source())
            del taken
            if components.offcpu is not None:
                self._checkpoint_offcpu(components.offcpu, journal)
            release_freed_memory()  # the checkpoint's encoded stacks (MBs with many new deep ones) given back
        except Exception as exc:  # noqa: BLE001 - the journal is insurance, the run goes on without it
            state.warnings.append(
                f"checkpoint journal stopped after {journal.cost.count} checkpoints ({exc.__class__.__name__}: {exc}); "
                "a kill from now on loses the samples since"
            )
            journal.close()
            self.journal = None

    def _checkpoint_offcpu(self, offcpu: OffCpuLike, journal: CheckpointWriter) -> None:
        """The off-CPU sums so far, named, beside the journal (profiler/capture/offcpucheckpoint.py); a
        failure is a warning and leaves the previous copy, the on-CPU journal goes on."""
        began, cpu_began = time.monotonic(), time.thread_time()
        try:
            taken = OffCpuCheckpoint(
                time.time(), self.options.off_cpu_min_block_ms, self.options.off_cpu_sample_every,
                offcpu.checkpoint_entries(),
            )
            size = write_offcpu_checkpoint(journal.directory, taken)
        except Exception as exc:  # noqa: BLE001 - insurance, like the journal: the run goes on
            note = f"off-CPU checkpoint failed ({exc.__class__.__name__}: {exc}); a kill loses the blocked time since"
            if note not in self.state.warnings:
                self.state.warnings.append(note)
            return
        cost = journal.cost  # overhead.json's checkpoint figures include the off-CPU copy
        cost.bytes += size
        cost.seconds += time.monotonic() - began
        cost.cpu_seconds += time.thread_time() - cpu_began

    def _drop_journal(self) -> None:
        """The capture is written: the journal and its perf-map copies go."""
        if self.journal is not None:
            self.journal.close()
        shutil.rmtree(checkpoint_dir(self.options.out), ignore_errors=True)

    def _guarded(self, what: str, action: Callable[..., object], *args: object) -> None:
        """Optional parts (event counting) must never end a run: a failure becomes a warning."""
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001
            self.state.warnings.append(f"{what}: {exc.__class__.__name__}: {exc}")

    def _enter(self, components: Components, process: ProcessInfo) -> None:
        """A process enters the scope: counters for all, stacks for workload."""
        for action in self._entry_actions(components, process):
            try:
                action()
            except (ProcessLookupError, FileNotFoundError, PermissionError) as exc:
                # a process that exits while being added is recorded, not an error
                self.state.warnings.append(f"pid {process.pid}: could not be fully added ({exc})")
                return

    def _entry_actions(self, components: Components, process: ProcessInfo) -> list[Callable[[], None]]:
        actions: list[Callable[[], None]] = [lambda: components.counters.add_pid(process.pid)]
        if process.sampled:
            actions.append(lambda: components.sampler.add_pid(process.pid))
            if components.offcpu is not None:  # before the symbols (seconds): its window starts here
                actions.append(lambda: components.offcpu.add_pid(process.pid))  # type: ignore[union-attr]
            actions.append(lambda: components.sampler.prepare_symbols(process.pid))
            if self.journal is not None:
                actions.append(lambda: self.journal.note_process(process.pid))  # type: ignore[union-attr]
        if components.net is not None:
            actions.append(lambda: components.net.add_pid(process.pid))  # type: ignore[union-attr]
        return actions

    def _exit(self, components: Components, pid: int) -> None:
        components.counters.pid_exited(pid)
        components.sampler.pid_exited(pid)
        if components.offcpu is not None:
            components.offcpu.pid_exited(pid)
        try:
            self.state.counters[pid] = components.counters.read(pid)
        except Exception as exc:  # noqa: BLE001 - keep the run going; the reason is recorded
            self.state.warnings.append(f"pid {pid}: counters unreadable after exit ({exc})")

    # ------------------------------------------------------------------ after the window

    def write_capture(self, components: Components, profile: ApplicationProfile) -> None:
        """Write the capture of what ``components`` hold now, with this runner's state (``profiler
        recover`` replays a killed run's components and state into it)."""
        try:
            self._write_capture(components, profile)
        finally:
            self._add_late_warnings(components)

    def _write_capture(self, components: Components, profile: ApplicationProfile) -> None:
        """After the window: collect what the components hold, then write the capture directory."""
        post_start = (time.monotonic(), time.process_time())
        self.status.update("writing", force=True)
        state = self.state
        if not state.end_time:
            state.end_time = self.clock()
        if not state.start_time:
            state.start_time = state.end_time
        collected = self._collect(components)
        state.warnings.extend(self._health_warnings(collected.processes))
        state.warnings.extend(self._component_warnings(components))
        out = self.options.out
        capture.write_scope(out, collected.processes)
        profile_text = Path(self.options.profile).read_text(encoding=TEXT_ENCODING)
        capture.atomic_write_text(out / capture.PROFILE_COPY, profile_text)
        matcher = Matcher(profile)
        matched = self._write_stacks(collected.stacks, matcher)
        self._write_counters(collected.counters, collected.processes)
        for pid_net in collected.net.values():
            capture.write_net(out, pid_net)
        for pid, entries in collected.offcpu.items():
            capture.write_offcpu(out, pid, entries)
            if collected.offcpu_intervals is None:
                continue  # not split: a timeline of no interval would say no time fell in any
            intervals = {i: by_pid.get(pid, []) for i, by_pid in collected.offcpu_intervals.items()}
            capture.write_offcpu_timeline(out, pid, intervals)
        events = collected.events
        if events is not None:
            capture.write_events(out, replace(events, window_start=state.start_time, window_end=state.end_time))
        if collected.flink_vertices:
            capture.write_flink_vertices(
                out, collected.flink_vertices, collected.flink_subtasks, collected.flink_taskmanagers
            )
        self._write_results(collected, matched, matcher)
        if collected.spark_plans is not None:
            capture.write_spark_plans(out, collected.spark_plans)
            state.warnings.extend(
                f"Spark REST API: {note}; stage rows keep stage ids only, codegen stages are not named"
                for note in collected.spark_plans.get("notes", [])[:3]
                if not collected.spark_plans.get("plans")
            )
        state.meta = self._meta(components)
        capture.write_meta(out, state.meta)
        self._write_overhead(post_start)

    def _collect(self, components: Components) -> Collected:
        """Everything the components hold at the end; a component that fails leaves a warning, not a hole."""
        state = self.state
        try:
            processes = components.scope.finish(state.end_time)
        except Exception as exc:  # noqa: BLE001
            state.warnings.append(f"scope could not be finalised ({exc})")
            processes = []
        collected = Collected(processes, counters=dict(state.counters))
        if not state.window_started:
            return collected
        try:
            collected.stacks = components.sampler.collect()
        except Exception as exc:  # noqa: BLE001
            state.warnings.append(f"stacks could not be collected ({exc})")
        if components.offcpu is not None:
            try:
                collected.offcpu = components.offcpu.collect()
                collected.offcpu_intervals = components.offcpu.interval_entries
            except Exception as exc:  # noqa: BLE001
                state.warnings.append(f"off-CPU time could not be collected ({exc.__class__.__name__}: {exc})")
        for process in processes:
            if process.pid in collected.counters:
                continue
            try:
                collected.counters[process.pid] = components.counters.read(process.pid)
            except Exception as exc:  # noqa: BLE001
                state.warnings.append(f"pid {process.pid}: counters unreadable ({exc})")
        components.counters.stop_exits()
        if components.counters.exits_note:
            state.warnings.append(
                f"/proc counters: {components.counters.exits_note}: a process that exited may have lost what it "
                "did after its last reading (run as root, or --counters perf)"
            )
        if components.net is not None:
            try:
                collected.net = components.net.collect()
            except Exception as exc:  # noqa: BLE001
                state.warnings.append(f"network counts could not be collected ({exc})")
        try:
            collected.events = components.events.finish(state.end_time)
        except Exception as exc:  # noqa: BLE001
            collected.events = EventCount(None, "none", f"event count failed: {exc}")
            state.warnings.append(f"events: the count failed ({exc.__class__.__name__}: {exc}); use --events N")
        try:
            collected.flink_vertices = components.events.vertex_windows()
        except Exception as exc:  # noqa: BLE001
            state.warnings.append(f"events: Flink's vertex metrics could not be estimated ({exc})")
        if collected.flink_vertices:
            try:
                subtasks, managers = components.events.flink_placement()
                collected.flink_subtasks = subtasks
                collected.flink_taskmanagers = taskmanager_pids(managers, _listening_ports(processes))
            except Exception as exc:  # noqa: BLE001 - optional: vertices and subtasks still come from thread names
                state.warnings.append(f"events: Flink subtasks not placed on TaskManagers ({exc})")
        if components.spark_plans is not None:
            try:
                collected.spark_plans = components.spark_plans.finish()
            except Exception as exc:  # noqa: BLE001 - optional: the run goes on without stage names
                state.warnings.append(f"Spark plans could not be read ({exc.__class__.__name__}: {exc})")
        return collected

    def _write_stacks(self, stacks: Mapping[int, CollectedStacks], matcher: Matcher) -> dict[int, MatchResult]:
        """Each PID's stack table and sampler statistics; returns each PID's match."""
        out = self.options.out
        matched = {}
        for pid, collected in stacks.items():
            table = collected.table
            if table.timeline:
                table = table.clamped(self._last_interval())
            write_table(capture.table_path(out, pid), table, capture.atomic_write_chunks)
            capture.write_sampler_stats(out, collected.stats)
            matched[pid] = match_table(matcher, table)
        return matched

    def _write_results(self, collected: Collected, matched: Mapping[int, MatchResult], matcher: Matcher) -> None:
        """The host's pre-aggregated result rows and its unmatched stacks (Algorithm 1, lines 22-24)."""
        options, out = self.options, self.options.out
        sampled = [p for p in collected.processes if p.pid in matched or not p.sampled]
        offcpu = {pid: match_offcpu(matcher, entries) for pid, entries in collected.offcpu.items()}
        rows = aggregate_host(options.host, sampled, matched, collected.counters, collected.net, offcpu)
        capture.atomic_write_text(out / capture.result_file_name(options.host), capture.format_result_csv(rows))
        unmatched = unmatched_folded_lines(matched.values())
        capture.atomic_write_lines(out / capture.unmatched_file_name(options.host), unmatched)

    def _meta(self, components: Components) -> RunMeta:
        options, state = self.options, self.state
        cycles_source = "estimated"
        try:
            cycles_source = components.cycles_source()
        except Exception:  # noqa: BLE001 - the per-pid flags carry the truth anyway
            pass
        return RunMeta(
            host=options.host,
            hostname=socket.gethostname(),
            kernel=platform.release(),
            profiler_version=__version__,
            frequency=options.frequency,
            duration_requested=options.duration,
            start_time=state.start_time,
            end_time=state.end_time,
            stopped_by=state.stopped_by,
            cycles_source=cycles_source,
            exec_watch=state.exec_watch,
            net=state.net_mode,
            max_stack_depth=components.sampler.max_stack_depth,
            stack_storage_size=options.stack_storage_size,
            profile_name=Path(options.profile).name,
            warnings=tuple(dict.fromkeys(state.warnings)),
            stack_collection=components.sampler.collection,
            stack_walk=components.sampler.stack_walk,
            interval=options.interval,
            intervals=self._last_interval() + 1 if state.window_started else 0,
            perf_map_refresh=options.perf_map_refresh,
            thread_names=components.sampler.thread_names,
            off_cpu_min_block_ms=options.off_cpu_min_block_ms if options.off_cpu else None,
            off_cpu_sample_every=options.off_cpu_sample_every if options.off_cpu else None,
        )

    def _write_overhead(self, post_start: tuple[float, float]) -> None:
        """The profiler's own cost: CPU, BPF run time, memory, and the wall and CPU time writing took since
        ``post_start`` (monotonic, process CPU)."""
        state = self.state
        bpf_time, bpf_count = state.bpf_totals or (None, None)
        capture.write_overhead(
            self.options.out,
            Overhead(
                profiler_cpu_seconds=round(max(0.0, state.cpu_after - state.cpu_before), 4),
                bpf_run_time_ns=bpf_time,
                bpf_run_count=bpf_count,
                bpf_stats_seconds=state.bpf_stats_seconds,
                post_run_seconds=round(time.monotonic() - post_start[0], 3),
                post_run_cpu_seconds=round(time.process_time() - post_start[1], 3),
                peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                rss_baseline_bytes=state.rss_baseline,
                timeline=tuple(state.overhead_points),
                name_batches=state.name_batches,
                name_batch_stacks=state.name_batch_stacks,
                name_batch_cpu_seconds=round(state.name_batch_cpu, 4),
                **self._checkpoint_cost(),
            ),
        )

    def _checkpoint_cost(self) -> dict[str, Any]:
        cost = self.journal.cost if self.journal is not None else None
        if cost is None or not cost.count:
            return {}
        return {
            "checkpoints": cost.count,
            "checkpoint_cpu_seconds": round(cost.cpu_seconds, 4),
            "checkpoint_seconds": round(cost.seconds, 4),
            "checkpoint_bytes": cost.bytes,
        }

    def _write_counters(self, counters: dict[int, PidCounters], processes: Sequence[ProcessInfo]) -> None:
        """counters.json per PID, and its per-interval deltas (the final reading closes the last interval)."""
        out, state, interval = self.options.out, self.state, self.options.interval
        exited_at = {p.pid: p.last_seen for p in processes if p.exited}
        last = self._last_interval()
        for pid, pid_counters in counters.items():
            capture.write_counters(out, pid_counters)
            if not state.window_started:
                continue
            ended = min(exited_at.get(pid, state.end_time), state.end_time)
            final = CounterReading.of(min(last_interval_of(ended - state.start_time, interval), last), pid_counters)
            readings = [r for r in state.counter_readings.get(pid, []) if r.interval <= final.interval]
            capture.write_counters_timeline(out, pid, interval, counter_deltas([*readings, final]))

    @staticmethod
    def _component_warnings(components: Components) -> list[str]:
        """The components word their own end-of-run warnings, with the option to change; a target's
        refused files (links, FIFOs, oversized: profiler/files/safeio.py) are named once each."""
        found = list(components.sampler.warnings)
        found.extend(safeio.take_warnings())
        if components.net is not None:
            found.extend(components.net.warnings)
        if components.offcpu is not None:
            found.extend(components.offcpu.warnings)
        found.extend(components.events.warnings)
        return found

    def _add_late_warnings(self, components: Components) -> None:
        """Warnings raised while closing (e.g. a sysctl not restored) still reach meta.json."""
        meta = self.state.meta
        if meta is None:
            return
        late = [w for w in self._component_warnings(components) if w not in meta.warnings]
        late += [w for w in self.state.warnings if w not in meta.warnings]
        if late:
            meta = replace(meta, warnings=meta.warnings + tuple(dict.fromkeys(late)))
            capture.write_meta(self.options.out, meta)
            self.state.meta = meta

    @staticmethod
    def _health_warnings(processes: Sequence[ProcessInfo]) -> list[str]:
        # lost/truncated stacks and missing frame pointers are the sampler's own warnings
        if not any(p.sampled for p in processes):
            return ["no workload process was found: check --known-spes or add --pid"]
        return []

    def _close(self, components: Components) -> None:
        if self.journal is not None:
            self.journal.close()
        # The optional tracers first: the off-CPU tracer's JVM thread watch reads through namers it borrows
        # from the sampler (their /proc/PID/mem descriptors), which the sampler's close() closes.
        for optional in (components.net, components.offcpu):
            if optional is not None:
                try:
                    optional.close()
                except Exception:  # noqa: BLE001
                    pass
        for closer in (components.sampler.close, components.scope.close, components.counters.close):
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - closing the others matters more
                self.state.warnings.append(f"close failed: {exc}")


@contextmanager
def stop_on_signals(runner: Runner) -> Iterator[None]:
    """SIGINT/SIGTERM end the window early instead of killing the process; restored afterwards."""
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: object) -> None:
        runner.request_stop()

    # not SIGHUP: a remote profiler must outlive a dropped SSH session (it is started under nohup)
    for signum in (int(signal.SIGINT), int(signal.SIGTERM)):
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def validate_inputs(options: RunOptions) -> ApplicationProfile:
    """Every input is checked before any work starts; returns the loaded application profile."""
    from ..errors import ConfigError
    from ..matching.appprofile import load_profile
    from ..scope.spes import load_known_spes

    profile = load_profile(options.profile)
    load_known_spes(options.known_spes)
    for pid in options.pids:
        if not Path(f"/proc/{pid}").exists():
            raise ConfigError(f"--pid {pid}: no such process; check the pid (ps -p {pid})")
    return profile


def run_capture(
    options: RunOptions, components: Components | None = None, announce: Callable[[str], None] | None = None
) -> Path:
    """Checks first (input files, privileges, output dir), then the run."""
    profile = validate_inputs(options)
    check_privileges()
    prepare_output(options.out, options.force)
    if announce is not None:
        announce(f"sampling for {options.duration:g} s at {options.frequency} Hz into {options.out}")
    runner = Runner(options, components)
    with stop_on_signals(runner):
        return runner.run(profile)


__all__ = ["RunOptions", "Runner", "Components", "run_capture"]
