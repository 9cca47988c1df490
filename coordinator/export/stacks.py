"""What every export is made of: the stacks of each sampled process of a run, each with the task the
summary counted it in (``profiler.matching.matcher``, with the summary's own profile and sub-window), and the
process's CPU seconds and cycles as the analysis computed them.

``collect_stacks``/``select`` are pure; ``load_export_set`` reads a run directory (or bare capture).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.capture.folded import FRAME_SEPARATOR, sanitize_frame
from profiler.capture.format import ALL_TASKS
from profiler.capture.offcpu import OffCpuEntry
from profiler.errors import CaptureFormatError, ConfigError
from profiler.matching.matcher import Matcher

if TYPE_CHECKING:
    from coordinator.analysis.load import RunData

TASK_FRAME_PREFIX = "[task: "  # the task as a root frame: "[task: Kafka]" (speedscope, folded)


@dataclass(frozen=True)
class ExportProcess:
    """One sampled process and the totals its stacks are scaled by."""

    run: str
    host: str
    pid: int
    role: str
    engine: str
    kind: str
    frequency: float | None  # sampling frequency in Hz (meta.json)
    samples: int  # all samples of the process in the analysed window (the summary's PID `*` samples)
    cpu_seconds: float | None  # the analysis's CPU seconds of the PID (summary `*` row), None when unknown
    cycles: float | None
    cycles_estimated: bool

    @property
    def label(self) -> str:
        return f"{self.host} PID {self.pid} ({self.engine} {self.kind})"


@dataclass(frozen=True)
class _ProcessStack:
    """One folded stack (root first, the thread name as root) of one process, in one task."""

    process: ExportProcess
    task: str
    stack: str

    @property
    def frames(self) -> list[str]:
        return self.stack.split(FRAME_SEPARATOR)

    @property
    def thread(self) -> str:
        return self.stack.partition(FRAME_SEPARATOR)[0]


@dataclass(frozen=True)
class TaskStack(_ProcessStack):
    """Samples of one folded stack of one process, in one task."""

    count: int

    @property
    def cpu_seconds(self) -> float | None:
        """The process's CPU seconds × this stack's share of its samples (summary.csv's rule)."""
        process = self.process
        if process.cpu_seconds is None or process.samples <= 0:
            return None
        return process.cpu_seconds * self.count / process.samples

    @property
    def cycles(self) -> float | None:
        process = self.process
        if process.cycles is None or process.samples <= 0:
            return None
        return process.cycles * self.count / process.samples


@dataclass(frozen=True)
class OffCpuStack(_ProcessStack):
    """Blocked nanoseconds of one folded stack of one process for one cause (``offcpu.folded``, runs with
    --off-cpu), in the task the same matcher gives the stack."""

    cause: str
    blocked_ns: int


@dataclass(frozen=True)
class ExportSet:
    """The stacks of a run (or a selection of it) with their tasks."""

    run_id: str
    task_names: tuple[str, ...]  # profile order, then ``unmatched``
    processes: tuple[ExportProcess, ...]
    stacks: tuple[TaskStack, ...]  # by process (run, host, pid), then most samples first
    start_time: float | None = None  # unix seconds: the earliest host window start
    duration: float | None = None  # seconds: the longest host window
    window: str | None = None  # the analysis's sub-window, as the report describes it
    left_out: tuple[str, ...] = ()  # "host: why" for each host with no readable capture
    offcpu: tuple[OffCpuStack, ...] = ()  # blocked time (runs with --off-cpu, whole window only), as stacks

    def task_samples(self) -> dict[tuple[str, int, str], int]:
        """(host, pid, task) -> samples: what summary.csv's PID rows count."""
        totals: dict[tuple[str, int, str], int] = {}
        for stack in self.stacks:
            key = (stack.process.host, stack.process.pid, stack.task)
            totals[key] = totals.get(key, 0) + stack.count
        return totals


def collect_stacks(per_process: Iterable[tuple[ExportProcess, Mapping[str, int]]], matcher: Matcher) -> list[TaskStack]:
    """Every stack of every process with the task ``matcher`` gives it (``Matcher.classify``, the
    rule summary.csv counts with); non-positive counts are left out. Per process the stacks come most
    samples first, ties by stack text, so exports are deterministic."""
    names = matcher.result_names
    out: list[TaskStack] = []
    for process, counts in per_process:
        ordered = sorted(((s, c) for s, c in counts.items() if c > 0), key=lambda item: (-item[1], item[0]))
        for stack, count in ordered:
            out.append(TaskStack(process, names[matcher.classify(stack)[0]], stack, count))
    return out


def collect_offcpu(
    per_process: Iterable[tuple[ExportProcess, Sequence[OffCpuEntry]]], matcher: Matcher
) -> list[OffCpuStack]:
    """Every off-CPU entry of every process with its task (the same leaf-first rule as the samples'),
    most blocked time first per process, ties by stack and cause; empty entries left out."""
    names = matcher.result_names
    out: list[OffCpuStack] = []
    for process, entries in per_process:
        for entry in sorted(entries, key=lambda e: (-e.blocked_ns, e.stack, e.cause)):
            if entry.blocked_ns > 0:
                task = names[matcher.classify(entry.stack)[0]]
                out.append(OffCpuStack(process, task, entry.stack, entry.cause, entry.blocked_ns))
    return out


def select(
    export: ExportSet,
    tasks: Sequence[str] = (),
    hosts: Sequence[str] = (),
    pids: Sequence[int] = (),
) -> ExportSet:
    """Only the stacks of these tasks, hosts and PIDs (an empty filter keeps everything). A name that
    is not in the run is a ConfigError naming what is."""
    _check_known("task", tasks, export.task_names)
    _check_known("host", hosts, sorted({p.host for p in export.processes}))
    _check_known("PID", pids, sorted({p.pid for p in export.processes if not hosts or p.host in hosts}))
    processes = tuple(p for p in export.processes if (not hosts or p.host in hosts) and (not pids or p.pid in pids))
    kept = set(processes)
    stacks = tuple(s for s in export.stacks if s.process in kept and (not tasks or s.task in tasks))
    offcpu = tuple(s for s in export.offcpu if s.process in kept and (not tasks or s.task in tasks))
    task_names = tuple(t for t in export.task_names if not tasks or t in tasks)
    return replace(export, task_names=task_names, processes=processes, stacks=stacks, offcpu=offcpu)


def _check_known(what: str, asked: Sequence[object], known: Sequence[object]) -> None:
    missing = [value for value in asked if value not in known]
    if missing:
        choices = ", ".join(str(k) for k in known) or "none"
        raise ConfigError(f"{what} {missing[0]}: not in this run; choose from: {choices}")


def task_frame(task: str) -> str:
    """The root frame that names a stack's task (speedscope and folded exports)."""
    return sanitize_frame(f"{TASK_FRAME_PREFIX}{task}]")


def frame_names(stack: TaskStack | OffCpuStack, with_task: bool) -> list[str]:
    """Frames of a stack root first; with ``with_task`` the task's frame before the thread."""
    frames = stack.frames
    return [task_frame(stack.task), *frames] if with_task else frames


# ---------------------------------------------------------------- reading a run (I/O)


def _pid_totals(rows: Iterable[Mapping[str, str]]) -> dict[tuple[str, str, str], Mapping[str, str]]:
    """(run, host, pid) -> that PID's `*` row of summary.csv (or of <host>_result.csv)."""
    return {
        (row.get("run", ""), row.get("host", ""), row.get("pid", "")): row
        for row in rows
        if row.get("task") == ALL_TASKS and row.get("pid") not in (None, "", ALL_TASKS)
    }


def _cell(row: Mapping[str, str] | None, column: str) -> float | None:
    from coordinator.analysis.rows import cell_number

    return cell_number(row.get(column) if row is not None else None, lenient=True)


def load_export_set(run_dir: Path) -> ExportSet:
    """The stacks of every sampled process of a run directory (or bare capture), matched with the
    profile summary.csv was computed with and restricted to its sub-window, as the report draws them."""
    from coordinator.analysis.load import load_run, load_run_offcpu, load_run_stacks

    run = load_run(run_dir)
    if run.profile_text is None:
        raise ConfigError(f"{run_dir}: no application profile in the run; run `coordinator analyze {run_dir}` first")
    unreadable = [h.reason for h in run.hosts if h.state == "unreadable"]
    if unreadable and all(h.capture is None for h in run.hosts):
        raise CaptureFormatError(unreadable[0])  # nothing to export: the damage is the answer, not an empty file
    stacks = load_run_stacks(run)
    left_out = tuple(f"{h.name}: {h.reason or h.state}" for h in run.hosts if h.capture is None)
    problems: list[str] = []  # an unreadable offcpu.folded leaves that PID's blocked time out, as in the report
    offcpu = load_run_offcpu(run, problems)  # with --from/--to the sub-window's, as the report draws it
    return replace(export_set_of(run, stacks, offcpu), left_out=left_out + tuple(problems))


def export_set_of(
    run: RunData,
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]],
    offcpu: Mapping[str, Mapping[int, Sequence[OffCpuEntry]]] | None = None,
) -> ExportSet:
    """The ExportSet of a loaded run and its stacks (host -> pid -> stack -> samples, as the report
    loads them). CPU seconds and cycles per process come from summary.csv's PID `*` rows (the
    analysis's own numbers, sub-window included), else from the capture's counters. ``offcpu``: host ->
    pid -> off-CPU entries of the same processes. Needs the run's profile (``run.profile_text``)."""
    from profiler.matching.appprofile import parse_profile

    matcher = Matcher(parse_profile(run.profile_text or "", run.profile_source or "<profile>"))
    totals = _pid_totals(run.rows)
    per_process: list[tuple[ExportProcess, Mapping[str, int]]] = []
    blocked: list[tuple[ExportProcess, Sequence[OffCpuEntry]]] = []
    starts, durations = [], []
    for host in run.hosts:
        if host.capture is None or host.name not in stacks:
            continue
        meta = host.capture.meta
        starts.append(meta.start_time)
        durations.append(meta.duration)
        by_pid = {p.pid: p for p in host.capture.processes}
        for pid, counts in sorted(stacks[host.name].items()):
            info = by_pid[pid]
            counters = host.capture.counters.get(pid)
            # <host>_result.csv rows (a run not analysed yet) have no run column
            row = totals.get((run.run_id, host.name, str(pid))) or totals.get(("", host.name, str(pid)))
            if row is not None:
                cpu, cycles = _cell(row, "cpu_seconds"), _cell(row, "cycles")
                estimated = row.get("cycles_estimated") == "1"
            else:
                cpu = counters.cpu_seconds if counters is not None else None
                cycles = counters.cycles if counters is not None else None
                estimated = bool(counters.cycles_estimated) if counters is not None else False
            process = ExportProcess(
                run=run.run_id,
                host=host.name,
                pid=pid,
                role=info.role,
                engine=info.engine,
                kind=info.kind,
                frequency=float(meta.frequency) if meta.frequency else None,
                samples=sum(c for c in counts.values() if c > 0),
                cpu_seconds=cpu,
                cycles=cycles,
                cycles_estimated=estimated,
            )
            per_process.append((process, counts))
            blocked.append((process, (offcpu or {}).get(host.name, {}).get(pid, ())))
    return ExportSet(
        run_id=run.run_id,
        task_names=matcher.result_names,
        processes=tuple(p for p, _ in per_process),
        stacks=tuple(collect_stacks(per_process, matcher)),
        start_time=min(starts) if starts else None,
        duration=max(durations) if durations else None,
        window=_window_text(run.window),
        offcpu=tuple(collect_offcpu(blocked, matcher)),
    )


def _window_text(window: Mapping[str, object] | None) -> str | None:
    if not window:
        return None
    start, end = window.get("from"), window.get("to")
    return f"analysed sub-window --from {start if start is not None else 0} --to {end if end is not None else 'end'}"


__all__ = [
    "ExportProcess",
    "ExportSet",
    "OffCpuStack",
    "TaskStack",
    "collect_offcpu",
    "collect_stacks",
    "export_set_of",
    "frame_names",
    "load_export_set",
    "select",
    "task_frame",
]
