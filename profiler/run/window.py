"""The sampling window: the components started before it, the processes entered and left during it, an
interval's counters and footprint on each tick, and the checkpoint journal a killed run is recovered from.

Every BPF program is compiled and attached before the window starts (LLVM costs seconds of CPU); the
window only adds PIDs to in-kernel filters.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..bpf.compiler import release_compiler_pages, release_freed_memory
from ..bpf.stats import StatsSlices, bpf_prog_run_stats, window_stats
from ..capture.checkpoint import CheckpointWriter, checkpoint_dir, start_ticks
from ..capture.format import OverheadPoint, PidCounters, ProcessInfo
from ..capture.offcpucheckpoint import OffCpuCheckpoint, write_offcpu_checkpoint
from ..capture.timeline import CounterReading, rss_bytes
from ..files.textinput import TEXT_ENCODING
from .components import Components, OffCpuLike
from .options import RunOptions
from .start import wait_for_start
from .status import StatusWriter
from .threadcpu import ThreadCpu
from .write import last_interval_of

# Scope polling is most of the profiler's CPU while sampling (a /proc scan, exit checks, the exec
# watcher's queue): twice a second still lets a new process enter within a second.
POLL_INTERVAL = 0.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
    window_start_ns: int | None = None  # CLOCK_MONOTONIC at the window's start
    name_batches: int = 0  # each interval: native frames named during the window
    name_batch_stacks: int = 0
    name_batch_cpu: float = 0.0
    name_batch_failed: bool = False
    scope_cpu: float = 0.0  # the runner's thread in the scope's polls
    thread_cpu: dict[str, float] = field(default_factory=dict)  # the window's CPU by thread component (threadcpu.py)


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def command_started_ns() -> int | None:
    """CLOCK_MONOTONIC (ns) when this process began: its /proc/self/stat starttime (clock ticks of CLOCK_BOOTTIME)
    brought to the monotonic clock the kernel stamps samples with. None when unreadable."""
    ticks = start_ticks(os.getpid())
    if ticks is None:
        return None
    age_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - ticks * 1_000_000_000 // CLOCK_TICKS
    return time.monotonic_ns() - age_ns


def seconds_since(started_ns: int | None, at_ns: int | None) -> float | None:
    """Seconds from ``started_ns`` to ``at_ns`` (both CLOCK_MONOTONIC ns), None when either is unknown."""
    if started_ns is None or at_ns is None:
        return None
    return round((at_ns - started_ns) / 1e9, 3)


def own_rss() -> int:
    try:
        return rss_bytes(Path("/proc/self/status").read_text())
    except OSError:
        return 0


@dataclass(eq=False)
class Window:
    """One run's window over ``components``; what it gathers goes into ``state`` (the runner's, so that a
    failure still writes it) and its progress into ``status``."""

    options: RunOptions
    components: Components
    state: WindowState
    status: StatusWriter
    clock: Callable[[], float]
    stop_event: threading.Event
    journal: CheckpointWriter | None = field(default=None, init=False)  # the checkpoint journal, open during the window
    threads: ThreadCpu = field(default_factory=ThreadCpu, init=False)  # each thread's CPU in the window, by component

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a stop was requested."""
        if seconds > 0:
            self.stop_event.wait(seconds)
        return self.stop_event.is_set()

    def run(self) -> None:
        """Start the components, wait for the common start (run/start.py), then the window: processes entered
        and left, intervals ticked, checkpoints appended, until the duration or a stop request; then the sampling
        stops."""
        components = self.components
        options, state = self.options, self.state
        self._start_components()
        if options.start_at is not None:
            self.status.update("waiting", force=True)
            stopped, _given = wait_for_start(options.start_at, options.start_file, self.clock, self._wait)
            if stopped:
                state.stopped_by = "signal"
                state.start_time = state.end_time = self.clock()
                return
        with window_stats(lambda: bpf_prog_run_stats(components.prog_ids()), self.clock()) as bpf_stats:
            state.cpu_before = own_cpu_seconds()
            self.threads.begin()
            state.rss_baseline = own_rss()
            state.start_time = self.clock()
            state.window_start_ns = time.monotonic_ns()
            components.sampler.begin_window()
            state.window_started = True
            self.status.window_start = state.start_time
            initial = components.scope.processes()
            # Events first: entering the processes can take seconds (perf maps, symbol caches), and
            # Flink's first reading should come at the window's start.
            self._guarded("event counting could not start", components.events.start, initial, state.start_time)
            self._begin_journal()
            for process in initial:
                self._enter(process)
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
                    self._tick(next_tick - 1)
                    next_tick += 1
                if self.journal is not None and self.clock() >= next_checkpoint:
                    self._checkpoint()
                    next_checkpoint += options.checkpoint
                self.threads.sample()
                scope_began = time.thread_time()
                new, exited = components.scope.poll()
                state.scope_cpu += time.thread_time() - scope_began
                for process in new:
                    self._enter(process)
                    self._guarded("event counting", components.events.add_process, process)
                    if components.spark_plans is not None:
                        self._guarded("Spark plans", components.spark_plans.add_process, process)
                    if process.sampled:
                        sampled.append(process.pid)
                for pid in exited:
                    self._exit(pid)
                self.status.processes += len(new)
                self.status.update()
            self._end(next_tick, bpf_stats)

    def _start_components(self) -> None:
        """Every program compiled and attached, the scope's first processes found. Their unwind tables and
        vmStructs are not waited for: the sampler prepares each target beside sampling, from its add_pid()
        in the window, with a deadline per target (profiler/sampling/preparation.py)."""
        components, state = self.components, self.state
        components.sampler.start()
        if components.net is not None:
            state.net_mode = components.net.start()
        if components.offcpu is not None:
            components.offcpu.start()
        components.scope.start()
        state.exec_watch = components.scope.exec_watch_mode
        release_freed_memory()  # every BPF compile's freed heap
        release_compiler_pages()  # every program is compiled: LLVM's ~85 MB of code is not needed again

    def _end(self, next_tick: int, bpf_stats: StatsSlices | None) -> None:
        """The window is over: its last interval ticked, the tracers stopped, the BPF run time estimated."""
        components, state = self.components, self.state
        state.end_time = self.clock()
        last_interval = self.last_interval()
        if last_interval >= next_tick - 1:
            self._tick(last_interval)
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
        state.cpu_after = own_cpu_seconds()
        self.threads.sample()
        state.thread_cpu = self.threads.by_component()

    def last_interval(self) -> int:
        """The window's last timeline interval. The loop ends a hair after the deadline: that sliver
        (the window is never longer than --duration) belongs to the last whole interval."""
        state, options = self.state, self.options
        return last_interval_of(min(state.end_time - state.start_time, options.duration), options.interval)

    def _tick(self, interval: int) -> None:
        """An interval of the timeline closes: counters of every live process, and our own footprint."""
        components = self.components
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
        self._name_batch()
        state.overhead_points.append(
            OverheadPoint(
                t=round(self.clock() - state.start_time, 3),
                rss_bytes=own_rss(),
                cpu_seconds=round(own_cpu_seconds() - state.cpu_before, 4),
            )
        )

    def _name_batch(self) -> None:
        """Native frames named while the processes run (a failure leaves them to the pass after the window)."""
        components = self.components
        state = self.state
        cpu = time.thread_time()  # the batch runs in this thread; the process's CPU would count the others'
        try:
            state.name_batch_stacks += components.sampler.name_batch()
        except Exception as exc:  # noqa: BLE001 - an optimisation: the post-run pass names what it missed
            if not state.name_batch_failed:
                state.warnings.append(f"native frames not named during the window ({exc.__class__.__name__}: {exc})")
            state.name_batch_failed = True
        state.name_batches += 1
        release_freed_memory()  # bcc's lookups: their freed heap would stay resident under the live stacks
        state.name_batch_cpu += time.thread_time() - cpu

    def _begin_journal(self) -> None:
        """Open the journal with the run's header (the window has begun: the sampler's facts are known)."""
        components = self.components
        options, state = self.options, self.state
        if options.checkpoint <= 0 or components.sampler.collection != "ringbuf":
            return
        journal = CheckpointWriter(checkpoint_dir(options.out))
        try:
            journal.begin(self._journal_header())
        except OSError as exc:
            state.warnings.append(f"checkpoint journal not started ({exc}); a killed run would lose its samples")
            journal.close()
            return
        self.journal = journal

    def _journal_header(self) -> dict[str, Any]:
        """What `profiler recover` needs besides the checkpoints: the run's options and the sampler's facts."""
        components = self.components
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

    def _checkpoint(self) -> None:
        """Append a checkpoint; a failure (disk full) ends the journal with a warning, never the run."""
        components = self.components
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

    def _guarded(self, what: str, action: Callable[..., object], *args: object) -> None:
        """Optional parts (event counting) must never end a run: a failure becomes a warning."""
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001
            self.state.warnings.append(f"{what}: {exc.__class__.__name__}: {exc}")

    def _enter(self, process: ProcessInfo) -> None:
        """A process enters the scope: counters for all, stacks for workload."""
        for action in self._entry_actions(process):
            try:
                action()
            except (ProcessLookupError, FileNotFoundError, PermissionError) as exc:
                # a process that exits while being added is recorded, not an error
                self.state.warnings.append(f"pid {process.pid}: could not be fully added ({exc})")
                return

    def _entry_actions(self, process: ProcessInfo) -> list[Callable[[], None]]:
        components = self.components
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

    def _exit(self, pid: int) -> None:
        components = self.components
        components.counters.pid_exited(pid)
        components.sampler.pid_exited(pid)
        if components.offcpu is not None:
            components.offcpu.pid_exited(pid)
        try:
            self.state.counters[pid] = components.counters.read(pid)
        except Exception as exc:  # noqa: BLE001 - keep the run going; the reason is recorded
            self.state.warnings.append(f"pid {pid}: counters unreadable after exit ({exc})")
