"""Per-PID performance counters (the paper's PMC component): cycles, instructions, ... task-clock.

How threads are covered: at ``add_pid`` every thread in /proc/PID/task gets one counting fd per
event with ``inherit=1`` (and ``inherit_thread=1`` where the kernel has it, Linux 5.13+). Every
thread created later is created by a thread we count, so the kernel inherits the counter into it
and folds its count into ours when it exits; reading our fds returns the sum, live children
included. A later re-scan of /proc/PID/task would therefore count inherited threads twice, so we
deliberately do not re-scan. The one gap is a thread created in the few milliseconds between
listing the threads and opening its creator's fd; perf stat -p has the same window. Add a pid as
early as possible (the exec watcher adds a fresh JVM while it still has one or two threads).

``inherit_thread`` keeps processes the target forks (Spark's Worker launching an executor, PySpark's
daemon forking workers) out of its counts: those are scope processes of their own. On kernels
without it, forked children count into their parent and every value carries the note "children
included".

Unsupported events are recorded with the reason and value None, never 0. Without a hardware PMU
cycles are estimated as task-clock seconds x the nominal CPU frequency (``cycles_estimated``).

Where the software events come from (``source``): every perf event costs the counted thread a perf
context switch at each of its context switches (+2.1 µs per switch for the default software set on a
host without a PMU, docs/benchmarks/overhead.md). ``proc`` reads task-clock, page-faults,
context-switches and cpu-migrations from /proc instead (proc_counters.py); hardware events stay perf
events. ``auto`` (the default) takes them from /proc when none of the requested hardware events opens
here, i.e. when the perf context would exist for the software events alone; ``perf`` counts everything
with perf events as before. While a pid is counted from /proc, a taskstats listener (taskstats.py,
opened with the first such pid, closed in ``close``) delivers the exit records of its threads, so what
it did after its last reading is not lost at its exit.
"""

from __future__ import annotations

import errno
import os
import re
import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.format import CounterValue, PidCounters
from ..errors import ConfigError
from .perf_event import EventSpec, LinuxPerfSyscalls, PerfSyscalls, RawCount, describe_errno, event_spec
from .proc_counters import PROC_EVENTS, THREAD_READINGS_EVERY_S, PidProcCounters, ProcFiles
from .taskstats import ExitSource, NoExits, ThreadExit, open_exit_source

DEFAULT_EVENTS: tuple[str, ...] = (
    "cycles",
    "instructions",
    "branches",
    "branch-misses",
    "cache-references",
    "cache-misses",
    "stalled-cycles-frontend",
    "stalled-cycles-backend",
    "task-clock",
    "context-switches",
    "cpu-migrations",
    "page-faults",
)
TASK_CLOCK = "task-clock"
CYCLES = "cycles"
NOTE_SCALED = "scaled"
NOTE_CHILDREN = "children included"
COUNTER_SOURCES = ("auto", "perf", "proc")

# ---------------------------------------------------------------- nominal frequency

_MODEL_GHZ = re.compile(r"@\s*([0-9]+(?:\.[0-9]+)?)\s*([GM])Hz", re.IGNORECASE)


def parse_model_name_hz(cpuinfo: str) -> float | None:
    """The frequency in the CPU's marketing name (``Intel(R) Xeon(R) ... @ 2.10GHz``)."""
    for line in cpuinfo.splitlines():
        if line.lower().startswith("model name"):
            match = _MODEL_GHZ.search(line)
            if match:
                scale = 1e9 if match.group(2).upper() == "G" else 1e6
                return float(match.group(1)) * scale
    return None


def parse_cpu_mhz(cpuinfo: str) -> float | None:
    """The first ``cpu MHz`` line (a momentary clock on hosts that scale, the TSC rate in most VMs)."""
    for line in cpuinfo.splitlines():
        if line.lower().startswith("cpu mhz"):
            _, _, value = line.partition(":")
            try:
                mhz = float(value.strip())
            except ValueError:
                continue
            if mhz > 0:
                return mhz * 1e6
    return None


def parse_khz_file(text: str) -> float | None:
    try:
        khz = int(text.strip())
    except ValueError:
        return None
    return khz * 1e3 if khz > 0 else None


def nominal_cpu_hz(
    cpuinfo_path: str | os.PathLike[str] = "/proc/cpuinfo",
    cpufreq_dir: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cpufreq",
) -> tuple[float | None, str]:
    """The CPU's nominal clock in Hz and where it came from, in order of trust: the model name's
    ``@ x.xxGHz``, sysfs base_frequency, sysfs cpuinfo_max_freq, /proc/cpuinfo ``cpu MHz``."""
    try:
        cpuinfo = Path(cpuinfo_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    hz = parse_model_name_hz(cpuinfo)
    if hz:
        return hz, f"{cpuinfo_path} model name"
    for name in ("base_frequency", "cpuinfo_max_freq"):
        path = Path(cpufreq_dir) / name
        try:
            hz = parse_khz_file(path.read_text())
        except OSError:
            hz = None
        if hz:
            return hz, str(path)
    hz = parse_cpu_mhz(cpuinfo)
    if hz:
        return hz, f"{cpuinfo_path} cpu MHz"
    return None, "unknown (no model name frequency, cpufreq or cpu MHz)"


# ---------------------------------------------------------------- scaling


@dataclass(frozen=True)
class EventTotal:
    """The scaled sum over the fds of one event."""

    value: float | None
    enabled_ns: int
    running_ns: int
    note: str


def scale_counts(counts: Sequence[RawCount]) -> EventTotal:
    """Sum per-thread counts, each scaled by enabled/running (multiplexing), as perf stat does.

    A fd that was enabled but never ran has no estimate: if no fd ran at all the value is None.
    """
    value = 0.0
    enabled = running = 0
    scaled = unscheduled = False
    measured = False
    for count in counts:
        enabled += count.enabled_ns
        running += count.running_ns
        if count.running_ns > 0:
            measured = True
            if count.running_ns < count.enabled_ns:
                scaled = True
                value += count.value * count.enabled_ns / count.running_ns
            else:
                value += count.value
        elif count.enabled_ns > 0:
            unscheduled = True
        # enabled 0: the thread never ran while counted, so it contributes nothing
    notes = []
    if scaled:
        notes.append(NOTE_SCALED)
    if unscheduled and measured:
        notes.append("partly never scheduled on the PMU")
    if unscheduled and not measured:
        return EventTotal(None, enabled, running, "never scheduled on the PMU (too many events multiplexed)")
    return EventTotal(value, enabled, running, ", ".join(notes))


def derive_cycles(
    events: Mapping[str, CounterValue], nominal_hz: float | None
) -> tuple[float | None, bool, float | None]:
    """(cycles, cycles_estimated, cpu_seconds): measured cycles when the PMU counted them, else
    task-clock seconds x nominal Hz."""
    task_clock = events.get(TASK_CLOCK)
    cpu_seconds = (
        task_clock.value / 1e9 if task_clock and task_clock.supported and task_clock.value is not None else None
    )
    cycles = events.get(CYCLES)
    measured = cycles is not None and cycles.supported and cycles.value is not None
    # A PMU that reports 0 cycles for a process that ran (seen in some VMs) measured nothing.
    if (
        measured
        and cycles is not None
        and cycles.value is not None
        and (cycles.value > 0 or (cpu_seconds or 0) < 0.001)
    ):
        return cycles.value, False, cpu_seconds
    if cpu_seconds is not None and nominal_hz:
        return cpu_seconds * nominal_hz, True, cpu_seconds
    return None, False, cpu_seconds


# ---------------------------------------------------------------- counting


@dataclass
class _EventFds:
    spec: EventSpec
    fds: list[int] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)  # reason -> threads


def open_event(syscalls: PerfSyscalls, spec: EventSpec, tid: int, inherit_thread: bool) -> tuple[int, bool]:
    """Open one counter; returns (fd, whether inherit_thread is still in use). Kernels before 5.13
    reject the inherit_thread bit: count with plain inherit instead, and say so to the caller."""
    try:
        return syscalls.open(spec, tid, inherit_thread), inherit_thread
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.E2BIG) and inherit_thread:
            return syscalls.open(spec, tid, False), False
        raise


class PidCounterSet:
    """All perf events of one pid: one inherited counter per (thread at add time, event)."""

    def __init__(self, pid: int, specs: Sequence[EventSpec], syscalls: PerfSyscalls, inherit_thread: bool) -> None:
        self.pid = pid
        self._syscalls = syscalls
        self._events = {spec.name: _EventFds(spec) for spec in specs}
        self.inherit_thread = inherit_thread
        self.threads_at_open: list[int] = []
        self._frozen: dict[str, CounterValue] | None = None

    def open(self) -> None:
        self.threads_at_open = self._syscalls.threads(self.pid)
        for tid in self.threads_at_open:
            for state in self._events.values():
                try:
                    state.fds.append(self._open_one(state.spec, tid))
                except OSError as exc:
                    if exc.errno == errno.ESRCH:  # the thread ended between listing and opening
                        continue
                    reason = describe_errno(exc.errno, state.spec)
                    state.failures[reason] = state.failures.get(reason, 0) + 1

    def _open_one(self, spec: EventSpec, tid: int) -> int:
        fd, self.inherit_thread = open_event(self._syscalls, spec, tid, self.inherit_thread)
        return fd

    @property
    def open_fds(self) -> int:
        return sum(len(state.fds) for state in self._events.values())

    def read(self) -> dict[str, CounterValue]:
        if self._frozen is not None:
            return dict(self._frozen)
        values: dict[str, CounterValue] = {}
        for name, state in self._events.items():
            values[name] = self._read_event(state)
        return values

    def _read_event(self, state: _EventFds) -> CounterValue:
        if not state.fds:
            reason = "; ".join(state.failures) if state.failures else "process exited before counters were opened"
            return CounterValue(None, False, note=reason)
        counts: list[RawCount] = []
        for fd in state.fds:
            try:
                counts.append(self._syscalls.read(fd))
            except OSError as exc:
                state.failures[describe_errno(exc.errno, state.spec)] = 1
        total = scale_counts(counts)
        notes = [total.note] if total.note else []
        if state.failures:
            missing = sum(state.failures.values())
            notes.append(f"incomplete: {missing} thread(s) not counted ({'; '.join(state.failures)})")
        if not self.inherit_thread:
            notes.append(NOTE_CHILDREN)
        return CounterValue(total.value, total.value is not None, total.enabled_ns, total.running_ns, ", ".join(notes))

    def freeze(self) -> dict[str, CounterValue]:
        """Read the final values and release the fds (a pid that exited keeps its partial data)."""
        if self._frozen is None:
            self._frozen = self.read()
            for state in self._events.values():
                for fd in state.fds:
                    try:
                        self._syscalls.close(fd)
                    except OSError:
                        pass
                state.fds.clear()
        return dict(self._frozen)


def raise_fd_limit() -> int:
    """One fd per (thread, event): a JVM with 200 threads and 12 events needs 2400. Raise the soft
    limit to the hard one and return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return int(target)
        except (ValueError, OSError):
            pass
    return int(soft)


class CounterGroup:
    """Counters for every scope pid, opened when the pid enters the scope and frozen when it exits."""

    def __init__(
        self,
        events: Sequence[str] = DEFAULT_EVENTS,
        syscalls: PerfSyscalls | None = None,
        nominal_hz: tuple[float | None, str] | None = None,
        source: str = "auto",
        proc_files: ProcFiles | None = None,
        exit_source: Callable[[], ExitSource] = open_exit_source,
        thread_readings_every_s: float = THREAD_READINGS_EVERY_S,
    ) -> None:
        if source not in COUNTER_SOURCES:
            raise ConfigError(f"--counters: {source!r} is not one of {', '.join(COUNTER_SOURCES)}")
        specs: list[EventSpec] = []
        for name in events:
            try:
                specs.append(event_spec(name))
            except ValueError as exc:
                raise ConfigError(f"--events: {exc}") from None
        # task-clock is always counted: cpu_seconds and the cycle estimate come from it.
        if TASK_CLOCK not in {spec.name for spec in specs}:
            specs.append(event_spec(TASK_CLOCK))
        self.specs: tuple[EventSpec, ...] = tuple(dict((spec.name, spec) for spec in specs).values())
        self._syscalls: PerfSyscalls = syscalls if syscalls is not None else LinuxPerfSyscalls()
        self.nominal_hz, self.nominal_hz_source = nominal_hz if nominal_hz is not None else nominal_cpu_hz()
        self._probe: dict[str, str] | None = None
        self.source = source
        self._proc_files = proc_files if proc_files is not None else ProcFiles()
        self._threads_every_ns = int(thread_readings_every_s * 1e9)
        self._open_exits = exit_source
        self._exits: ExitSource | None = None  # opened with the first /proc-counted pid, closed in close()
        self._exits_closed = False  # stop_exits closed a source that worked: the window is over, not a loss
        self._sets: dict[int, PidCounterSet] = {}
        self._proc_sets: dict[int, PidProcCounters] = {}
        self._unsupported: dict[str, str] = {}
        self.proc_events: tuple[str, ...] = ()
        self.inherit_thread = True
        if syscalls is None:
            raise_fd_limit()

    def probe(self) -> dict[str, str]:
        """Event -> "ok" or why it cannot be counted, by opening it on this process."""
        if self._probe is None:
            result: dict[str, str] = {}
            me = os.getpid()
            for spec in self.specs:
                try:
                    fd = self._open_probe(spec, me)
                except OSError as exc:
                    result[spec.name] = describe_errno(exc.errno, spec)
                    continue
                try:
                    self._syscalls.read(fd)
                    result[spec.name] = "ok"
                except OSError as exc:
                    result[spec.name] = describe_errno(exc.errno, spec)
                finally:
                    self._syscalls.close(fd)
            self._probe = result
            self.proc_events = self._choose_proc_events(result)
            self._unsupported = {
                name: reason for name, reason in result.items() if reason != "ok" and name not in self.proc_events
            }
        return dict(self._probe)

    def _choose_proc_events(self, probe: Mapping[str, str]) -> tuple[str, ...]:
        """The events read from /proc: with ``auto`` only when no requested hardware event opens (a host
        without a PMU), since those keep a perf context in every thread anyway."""
        software = tuple(spec.name for spec in self.specs if spec.name in PROC_EVENTS)
        if self.source == "proc":
            return software
        if self.source == "auto" and not any(spec.hardware and probe.get(spec.name) == "ok" for spec in self.specs):
            return software
        return ()

    def _open_probe(self, spec: EventSpec, tid: int) -> int:
        fd, self.inherit_thread = open_event(self._syscalls, spec, tid, self.inherit_thread)
        return fd

    @property
    def cycles_source(self) -> str:
        """ "hardware" when the PMU counts cycles here, else "estimated"."""
        return "hardware" if self.probe().get(CYCLES) == "ok" else "estimated"

    def add_pid(self, pid: int) -> None:
        """Open counters for ``pid`` now; a pid already added is left alone."""
        if pid in self._sets:
            return
        self.probe()
        if self.proc_events:
            exits = self._route_exits()  # exits queued so far happened before this pid's first reading
            proc_set = PidProcCounters(
                pid,
                self.proc_events,
                self._proc_files,
                exits_unavailable=exits.unavailable,
                threads_every_ns=self._threads_every_ns,
            )
            proc_set.open()
            self._proc_sets[pid] = proc_set
        supported = [
            spec for spec in self.specs if spec.name not in self._unsupported and spec.name not in self.proc_events
        ]
        counter_set = PidCounterSet(pid, supported, self._syscalls, self.inherit_thread)
        if supported:  # no perf event at all: not even the thread listing
            counter_set.open()
        self._sets[pid] = counter_set

    def _route_exits(self) -> ExitSource:
        """Drain the exit records (opening the listener the first time) and hand each /proc-counted pid
        its own."""
        if self._exits is None:
            self._exits = self._open_exits()
        by_process: dict[int, list[ThreadExit]] = {}
        for record in self._exits.drain():  # every exit on the host: most are not ours
            if record.tgid in self._proc_sets:
                by_process.setdefault(record.tgid, []).append(record)
        for pid, records in by_process.items():
            self._proc_sets[pid].record_exits(records)
        return self._exits

    @property
    def exits_note(self) -> str:
        """Why exits are not (all) followed ("" when they are, or no /proc counter was opened)."""
        if self._exits is None:
            return ""
        if self._exits.overruns:
            return f"taskstats dropped exit records {self._exits.overruns} time(s) (its receive queue was full)"
        if self._exits_closed:
            return ""  # followed all window, then closed by stop_exits: nothing was missed
        return self._exits.unavailable

    def pid_exited(self, pid: int) -> None:
        if pid in self._proc_sets:
            self._route_exits()
        if pid in self._sets:
            self._sets[pid].freeze()
        if pid in self._proc_sets:
            self._proc_sets[pid].freeze()

    @property
    def pids(self) -> list[int]:
        return sorted(self._sets)

    def open_fds(self) -> int:
        return sum(counter_set.open_fds for counter_set in self._sets.values())

    def read(self, pid: int) -> PidCounters:
        if pid not in self._sets:
            raise KeyError(f"pid {pid} was never added to the counters")
        measured = self._sets[pid].read()
        if pid in self._proc_sets:
            self._route_exits()
            measured.update(self._proc_sets[pid].read())
        events: dict[str, CounterValue] = {}
        for spec in self.specs:
            if spec.name in self._unsupported:
                events[spec.name] = CounterValue(None, False, note=self._unsupported[spec.name])
            else:
                events[spec.name] = measured[spec.name]
        cycles, estimated, cpu_seconds = derive_cycles(events, self.nominal_hz)
        return PidCounters(pid, events, cycles, estimated, self.nominal_hz, cpu_seconds)

    def close(self) -> None:
        """Freeze every pid (values stay readable) and release all fds."""
        for counter_set in self._sets.values():
            counter_set.freeze()
        self.stop_exits()  # the exits queued so far reach their pids before these freeze
        for proc_set in self._proc_sets.values():
            proc_set.freeze()

    def stop_exits(self) -> None:
        """Deliver the exits queued so far and unregister from taskstats (the window is over): later
        readings see /proc alone."""
        if self._exits is None or isinstance(self._exits, NoExits):
            return
        try:
            if self._proc_sets:
                self._route_exits()
        finally:
            self._exits.close()
            self._exits_closed = not self._exits.unavailable
            closed = NoExits(self._exits.unavailable or "taskstats closed with the window")
            closed.overruns = self._exits.overruns
            self._exits = closed
