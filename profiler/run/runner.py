"""One host's profiling run: checks first, then the window, then the capture of what was collected.

The order matters for overhead and accuracy: every BPF program is compiled and attached before the
window starts (window.py), the window only adds PIDs to in-kernel filters, and all symbolization and
writing happen after it ends (write.py). Whatever happens (duration reached, SIGINT/SIGTERM, an
exception), everything collected so far is written.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from ..capture import format as capture
from ..capture.checkpoint import CheckpointWriter, checkpoint_dir
from ..capture.format import ComponentCpu, EventCount, Overhead, PidCounters, ProcessInfo, RunMeta
from ..engines.flinkmetrics import taskmanager_pids
from ..errors import NothingToSampleError, OutputWriteError, PrivilegeError
from ..files import safeio
from ..files.outputs import check_output_dir, mark_output_dir
from ..matching.appprofile import ApplicationProfile
from .components import Components, real_components
from .departures import departure_lines, nothing_line, nothing_to_sample
from .options import RunOptions
from .status import StatusWriter
from .threadcpu import split_components
from .window import Window, WindowState, command_started_ns, seconds_since
from .write import Collected, write_capture

CAP_PERFMON = 38
CAP_BPF = 39


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
    # user's) alone; the files in it are 0600 already (files/atomic.py's writers, the journal).
    # fchmod on a descriptor opened without following a link: the mode lands on the directory just
    # made, whatever the path's last component has become since.
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    mark_output_dir(out, "profiler run")


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


def _write_failure(out: Path, exc: OSError) -> OutputWriteError:
    try:
        free = f"{shutil.disk_usage(out).free // 1024} KiB free there"
    except OSError:
        free = "free space unknown"
    return OutputWriteError(
        f"{out}: writing the capture failed: {exc.strerror or exc} ({free}); the samples of this window are "
        "lost; free space in that filesystem (the coordinator writes into TMPDIR of the SSH session) and re-run"
    )


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
        self.window: Window | None = None
        self.meta: RunMeta | None = None  # meta.json as written
        self.command_time = clock()  # a --pid was checked just before: gone from here on, it gets a line
        self.nothing_sampled = False  # --pid given, every one gone before a sample: exit 7 once written

    @property
    def journal(self) -> CheckpointWriter | None:
        """The checkpoint journal while the window keeps one."""
        return self.window.journal if self.window is not None else None

    # signal handling is the command's business; the runner only watches the event
    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self, profile: ApplicationProfile) -> Path:
        """Sample over the window and write the capture; ``profile`` is the loaded application profile."""
        options = self.options
        out = options.out
        self.status.update("starting", force=True)
        safeio.take_warnings()  # another run's in this process are not this one's
        safeio.forget_slow_files()  # nor the processes and devices that blocked in its reads
        components = self._components or real_components(options)
        state = self.state
        failure: BaseException | None = None
        try:
            self._window(components)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the partial capture is written
            failure = exc
            state.stopped_by = "error" if not isinstance(exc, KeyboardInterrupt) else "signal"
            self._stop_sampling(components)
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
        if failure is None and self.nothing_sampled:
            failure = NothingToSampleError(nothing_line(options.pids))
        if failure is not None:
            self.status.update("failed", force=True, error=str(failure))
            raise failure
        self.status.update("done", force=True)
        return out

    def _window(self, components: Components) -> None:
        self.window = Window(self.options, components, self.state, self.status, self.clock, self.stop_event)
        self.window.run()

    @staticmethod
    def _stop_sampling(components: Components) -> None:
        """After a failure in the window: every tracer stopped, whatever the others do."""
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

    def _write_capture(self, components: Components, profile: ApplicationProfile) -> None:
        """After the window: collect what the components hold, then write the capture directory."""
        post_start = (time.monotonic(), time.process_time())
        self.status.update("writing", force=True)
        state = self.state
        if not state.end_time:
            state.end_time = self.clock()
        if not state.start_time:
            state.start_time = state.end_time
        collected = self._collect(components, post_start)
        self.meta = write_capture(self.options, collected, profile)

    def _collect(self, components: Components, post_start: tuple[float, float]) -> Collected:
        """Everything the components hold at the end, with the window's facts; a component that fails
        leaves a warning, not a hole."""
        state = self.state
        try:
            processes = components.scope.finish(state.end_time)
        except Exception as exc:  # noqa: BLE001
            state.warnings.append(f"scope could not be finalised ({exc})")
            processes = []
        counters = dict(state.counters)
        held: dict[str, Any] = {}
        if state.window_started:
            held = self._read_components(components, processes, counters)
        samples = {pid: stacks.stats.samples for pid, stacks in held.get("stacks", {}).items()}
        state.warnings.extend(
            departure_lines(self.options.pids, processes, samples, state.start_time, state.end_time, self.command_time)
        )
        self.nothing_sampled = state.window_started and nothing_to_sample(self.options.pids, processes, samples)
        if not self.options.pids:  # with --pid, the lines above say what became of each
            state.warnings.extend(self._health_warnings(processes))
        state.warnings.extend(self._component_warnings(components))
        return Collected(
            start_time=state.start_time,
            end_time=state.end_time,
            stopped_by=state.stopped_by,
            window_started=state.window_started,
            exec_watch=state.exec_watch,
            net_mode=state.net_mode,
            stack_collection=components.sampler.collection,
            stack_walk=components.sampler.stack_walk,
            max_stack_depth=components.sampler.max_stack_depth,
            thread_names=components.sampler.thread_names,
            cycles_source=self._cycles_source(components),
            processes=processes,
            counters=counters,
            counter_readings=state.counter_readings,
            warnings=tuple(state.warnings),
            cost=self._window_cost(components),
            post_start=post_start,
            **held,
        )

    def _read_components(
        self, components: Components, processes: Sequence[ProcessInfo], counters: dict[int, PidCounters]
    ) -> dict[str, Any]:
        """What the components hold after a window (``Collected``'s fields by name); ``counters`` gains
        the reading of every process that did not exit."""
        state = self.state
        held: dict[str, Any] = {}
        try:
            held["stacks"] = components.sampler.collect()
        except Exception as exc:  # noqa: BLE001
            state.warnings.append(f"stacks could not be collected ({exc})")
        if components.offcpu is not None:
            try:
                held["offcpu"] = components.offcpu.collect()
                held["offcpu_intervals"] = components.offcpu.interval_entries
            except Exception as exc:  # noqa: BLE001
                state.warnings.append(f"off-CPU time could not be collected ({exc.__class__.__name__}: {exc})")
        for process in processes:
            if process.pid in counters:
                continue
            try:
                counters[process.pid] = components.counters.read(process.pid)
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
                held["net"] = components.net.collect()
            except Exception as exc:  # noqa: BLE001
                state.warnings.append(f"network counts could not be collected ({exc})")
        held.update(self._read_engines(components, processes))
        return held

    def _read_engines(self, components: Components, processes: Sequence[ProcessInfo]) -> dict[str, Any]:
        """The events counted, Flink's vertices and their placement, Spark's plans (``Collected``'s fields)."""
        state = self.state
        held: dict[str, Any] = {}
        try:
            held["events"] = components.events.finish(state.end_time)
        except Exception as exc:  # noqa: BLE001
            held["events"] = EventCount(None, "none", f"event count failed: {exc}")
            state.warnings.append(f"events: the count failed ({exc.__class__.__name__}: {exc}); use --events N")
        vertices = []
        try:
            vertices = components.events.vertex_windows()
        except Exception as exc:  # noqa: BLE001
            state.warnings.append(f"events: Flink's vertex metrics could not be estimated ({exc})")
        held["flink_vertices"] = vertices
        if vertices:
            try:
                subtasks, managers = components.events.flink_placement()
                held["flink_subtasks"] = subtasks
                held["flink_taskmanagers"] = taskmanager_pids(managers, _listening_ports(processes))
            except Exception as exc:  # noqa: BLE001 - optional: vertices and subtasks still come from thread names
                state.warnings.append(f"events: Flink subtasks not placed on TaskManagers ({exc})")
        if components.spark_plans is not None:
            try:
                held["spark_plans"] = components.spark_plans.finish()
            except Exception as exc:  # noqa: BLE001 - optional: the run goes on without stage names
                state.warnings.append(f"Spark plans could not be read ({exc.__class__.__name__}: {exc})")
        return held

    @staticmethod
    def _cycles_source(components: Components) -> str:
        try:
            return components.cycles_source()
        except Exception:  # noqa: BLE001 - the per-pid flags carry the truth anyway
            return "estimated"

    def _window_cost(self, components: Components) -> Overhead:
        """The profiler's own cost during the window: CPU, BPF run time, memory, named batches, checkpoints."""
        state = self.state
        bpf_time, bpf_count = state.bpf_totals or (None, None)
        return Overhead(
            **self._start_up(components),
            profiler_cpu_seconds=round(max(0.0, state.cpu_after - state.cpu_before), 4),
            bpf_run_time_ns=bpf_time,
            bpf_run_count=bpf_count,
            bpf_stats_seconds=state.bpf_stats_seconds,
            rss_baseline_bytes=state.rss_baseline,
            timeline=tuple(state.overhead_points),
            name_batches=state.name_batches,
            name_batch_stacks=state.name_batch_stacks,
            name_batch_cpu_seconds=round(state.name_batch_cpu, 4),
            cpu_by_component=self._by_component(),
            **self._checkpoint_cost(),
        )

    def _by_component(self) -> tuple[ComponentCpu, ...]:
        """The window's CPU by component: its threads', the runner's thread split by what it measured itself."""
        state = self.state
        if not state.thread_cpu:
            return ()
        cost = self.journal.cost if self.journal is not None else None
        checkpoint = cost.cpu_seconds if cost is not None else 0.0
        parts = {"scope": state.scope_cpu, "naming": state.name_batch_cpu, "checkpoint": checkpoint}
        return split_components(state.thread_cpu, max(0.0, state.cpu_after - state.cpu_before), parts)

    def _start_up(self, components: Components) -> dict[str, Any]:
        """When the window began and the first sample came, in seconds since the command (overhead.json)."""
        started = command_started_ns()
        try:
            first = components.sampler.first_sample
        except Exception:  # noqa: BLE001 - a figure of the run's cost, never the run's failure
            first = None
        return {
            "window_start_at": seconds_since(started, self.state.window_start_ns),
            "first_sample_at": seconds_since(started, first[0] if first else None),
            "first_sample_cpu_seconds": round(first[1], 3) if first else None,
        }

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
        meta = self.meta
        if meta is None:
            return
        late = [w for w in self._component_warnings(components) if w not in meta.warnings]
        late += [w for w in self.state.warnings if w not in meta.warnings]
        if late:
            meta = replace(meta, warnings=meta.warnings + tuple(dict.fromkeys(late)))
            capture.write_meta(self.options.out, meta)
            self.meta = meta

    @staticmethod
    def _health_warnings(processes: Sequence[ProcessInfo]) -> list[str]:
        # lost/truncated stacks and missing frame pointers are the sampler's own warnings
        if not any(p.sampled for p in processes):
            return ["no workload process was found: check --known-spes or add --pid"]
        return []

    def _drop_journal(self) -> None:
        """The capture is written: the journal and its perf-map copies go."""
        if self.journal is not None:
            self.journal.close()
        shutil.rmtree(checkpoint_dir(self.options.out), ignore_errors=True)

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


__all__ = ["Runner", "run_capture"]
